"""The egress policy of local clusters: which destinations a job reaches, and which networks an
organisation's admin may open for its target. ``jobs/launchers/local/egress.py`` turns it into
the nftables rules each cluster's network namespace gets.

Outbound traffic leaves through slirp4netns, which makes each connection from the host: without
a policy a job reaches whatever the host reaches. By default a cluster reaches the public
internet only (pip, public object stores): every private, shared, link-local (cloud metadata
included), multicast and reserved range is refused, and so is every address of the host itself,
whatever range it lies in. slirp4netns's DNS forwarder is the one private address let through,
on port 53. An organisation's admin may allow-list networks for its target (a package mirror,
an object store) within what the operator lets them open (``MANTA_LOCAL_EGRESS_ALLOWABLE``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

SLIRP_DNS = "10.0.2.3"

# Not the public internet (IANA special-purpose registries), metadata services included
# (169.254.169.254, fd00:ec2::254).
DENIED_V4 = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
DENIED_V6 = (
    "::/127",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001:db8::/32",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
)
# Never allow-listed, whoever asks: the host's loopback and link-local (metadata) ranges.
NEVER_ALLOWED = ("127.0.0.0/8", "169.254.0.0/16", "::1/128", "fe80::/10", "0.0.0.0/8")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(values: Iterable[str], *, field: str) -> list[Network]:
    """CIDRs (or single addresses) as networks; ValueError naming ``field`` and the value."""
    found = []
    for value in values:
        try:
            found.append(ipaddress.ip_network(str(value).strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"{field}: {value!r} is not an IP address or CIDR network") from exc
    return found


def allow_problem(network: Network, allowable: Iterable[Network]) -> str | None:
    """Why an admin may not allow-list ``network`` (None when they may)."""
    for never in NEVER_ALLOWED:
        if network.overlaps(ipaddress.ip_network(never)):
            return f"{network} overlaps {never}, which no cluster may reach"
    if network.prefixlen == 0:
        return f"{network} is every address: allow-list the networks the jobs need"
    if not any(
        network.version == outer.version and network.subnet_of(outer) for outer in allowable
    ):
        return (
            f"{network} lies outside the networks this platform lets organisations open "
            "(MANTA_LOCAL_EGRESS_ALLOWABLE)"
        )
    return None

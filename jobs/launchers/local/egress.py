"""A local cluster's egress policy (``config/egress.py``) as the nftables rules its sandbox's
init loads into the cluster's network namespace, as root, before any tenant process exists: the
tenant has no capability to change them."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Iterable

from config.egress import DENIED_V4, DENIED_V6, SLIRP_DNS, Network, parse_networks


def host_addresses() -> list[str]:
    """Every address of the host's interfaces (``ip -j addr``): the host is never a
    destination. Empty when iproute2 cannot say (the ranges above still hold)."""
    try:
        out = subprocess.run(
            ["ip", "-j", "addr", "show"], capture_output=True, timeout=10, check=True
        ).stdout
        interfaces = json.loads(out or b"[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    return [
        info["local"]
        for interface in interfaces
        for info in interface.get("addr_info") or []
        if info.get("local")
    ]


def nft_rules(allow: Iterable[str], host: Iterable[str] = ()) -> str:
    """The nftables script for a cluster's network namespace."""
    allowed = list(parse_networks(allow, field="egress_allow"))
    denied = [
        *parse_networks(DENIED_V4 + DENIED_V6, field="denied"),
        *parse_networks(host, field="host"),
    ]
    lines = [
        "table inet manta_egress {",
        "  chain output {",
        "    type filter hook output priority 0; policy accept;",
        '    oifname "lo" accept',
        f"    ip daddr {SLIRP_DNS} udp dport 53 accept",
        f"    ip daddr {SLIRP_DNS} tcp dport 53 accept",
    ]
    for version, family in ((4, "ip"), (6, "ip6")):
        ours = _set([n for n in allowed if n.version == version])
        if ours:
            lines.append(f"    {family} daddr {ours} accept")
    for version, family, answer in (
        (4, "ip", "reject with icmp type admin-prohibited"),
        (6, "ip6", "reject with icmpv6 type admin-prohibited"),
    ):
        ours = _set([n for n in denied if n.version == version])
        if ours:
            lines.append(f"    {family} daddr {ours} {answer}")
    lines += ["  }", "}", ""]
    return "\n".join(lines)


def _set(networks: list[Network]) -> str:
    """An nftables anonymous set; overlapping intervals are merged (nft refuses them)."""
    merged = list(ipaddress.collapse_addresses(networks))  # type: ignore[type-var]
    return "{ " + ", ".join(str(n) for n in merged) + " }" if merged else ""

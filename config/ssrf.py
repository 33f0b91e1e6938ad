"""The SSRF policy: a URL a tenant gives us (a webhook, a Ray cluster's address) may only lead
to the public internet, or to networks the operator lists.

The host is resolved once, every address it resolves to is checked, and the caller connects to
the checked address (``Destination.address``) — never resolving the name again, so a DNS answer
that changes between the check and the connection (rebinding) cannot reach an internal address.
Loopback, private, link-local, CGNAT, multicast, reserved, unspecified and cloud-metadata
addresses are refused unless they fall inside the allowed networks. Callers run the check when
the URL is saved and again before every connection. No Django here: the webhook policy
(``notifications/``) and the compute target policy (``workspaces/``, the ``ray`` launcher) pass
their own settings.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
from urllib.parse import urlsplit

# Resolution goes through this name so tests can answer for hostnames of their own.
getaddrinfo = socket.getaddrinfo

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA = (
    ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, OpenStack, …
    ipaddress.ip_address("fd00:ec2::254"),  # AWS over IPv6
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
)
CGNAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class UnsafeURL(ValueError):
    """The URL may not be used; the message names the rule."""


@dataclasses.dataclass(frozen=True)
class Destination:
    scheme: str
    host: str  # as written in the URL: the Host header and the TLS server name
    port: int
    target: str  # path and query
    address: str  # the checked IP address to connect to

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def _networks(values: list[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(value.strip(), strict=False) for value in values if value.strip()]


def refusal(address: IPAddress, allowed_networks: list[str] = ()) -> str | None:
    """Why ``address`` may not be reached, or None if it may."""
    allowed = _networks(list(allowed_networks))
    if any(address in network for network in allowed if network.version == address.version):
        return None
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or (address.teredo or (None, None))[1]
        if embedded is None and address in NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            reason = refusal(embedded, allowed_networks)
            return f"{reason} (embedded in {address})" if reason else None
    if address in METADATA:
        return "a cloud metadata address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv4Address) and address in CGNAT:
        return "a carrier-grade NAT (shared) address"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "an address that is not globally routable"
    return None


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to (one lookup), or the literal address it is."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        infos = getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise UnsafeURL(f"the host {host!r} does not resolve") from exc
    addresses: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise UnsafeURL(f"the host {host!r} does not resolve")
    return addresses


# The schemes a URL may have, with their default ports; plain ones only where a setting allows.
WEB_SCHEMES = {"https": 443}
PLAIN_WEB_SCHEMES = {"http": 80}


def check_url(
    url: str,
    *,
    allowed_networks: list[str] = (),
    allow_http: bool = False,
    what: str = "webhooks",
    networks_setting: str = "WEBHOOK_ALLOWED_NETWORKS",
    http_setting: str = "WEBHOOK_ALLOW_HTTP",
    schemes: dict[str, int] = WEB_SCHEMES,
    plain_schemes: dict[str, int] = PLAIN_WEB_SCHEMES,
    allow_user: bool = False,
) -> Destination:
    """Parse, resolve and check ``url``; raise :class:`UnsafeURL` naming the rule it breaks.
    ``what`` and the setting names only word the messages; ``allow_user`` lets a user name
    without a password through (``ssh://git@host/…``)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeURL(f"not a valid URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in schemes and scheme not in plain_schemes:
        raise UnsafeURL(f"the URL must start with {' or '.join(f'{s}://' for s in schemes)}")
    if scheme in plain_schemes and not allow_http:
        raise UnsafeURL(
            f"plain {scheme}:// is not allowed; use {' or '.join(f'{s}://' for s in schemes)} "
            f"({http_setting})"
        )
    if parts.password is not None or (parts.username is not None and not allow_user):
        raise UnsafeURL("credentials in the URL are not allowed")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise UnsafeURL("the URL has no host")
    port = port or {**schemes, **plain_schemes}[scheme]
    addresses = resolve(host, port)
    for address in addresses:
        reason = refusal(address, allowed_networks)
        if reason:
            named = f"{host} is"
            if str(address) != host:
                named = f"{host} resolves to {address}, which is"
            raise UnsafeURL(
                f"{named} {reason}; {what} may only reach public addresses ({networks_setting})"
            )
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Destination(scheme, host, port, target, str(addresses[0]))


def check_compute_address(url: str, allowed_networks: list[str]) -> Destination:
    """The policy for a Ray cluster's address (a ``ray`` compute target): as for webhooks, over
    ``MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS``, with plain ``http://`` allowed (Ray's dashboard
    speaks it). Checked when the target is saved and before every connection."""
    return check_url(
        url,
        allowed_networks=allowed_networks,
        allow_http=True,
        what="compute targets",
        networks_setting="MANTA_COMPUTE_TARGET_ALLOWED_NETWORKS",
    )


GIT_SCHEMES = {"https": 443, "ssh": 22}
PLAIN_GIT_SCHEMES = {"http": 80, "git": 9418}


def check_git_url(url: str, allowed_networks: list[str], allow_plain: bool) -> Destination:
    """The policy for a git repository's URL (a code source): as for webhooks, over
    ``MANTA_CODE_SOURCE_ALLOWED_NETWORKS``; ``https://`` and ``ssh://`` (a user name allowed,
    never a password), unencrypted ``git://`` and ``http://`` only with
    ``MANTA_CODE_SOURCE_ALLOW_PLAIN``. Checked when the source is saved and before every fetch."""
    return check_url(
        url,
        allowed_networks=allowed_networks,
        allow_http=allow_plain,
        what="code sources",
        networks_setting="MANTA_CODE_SOURCE_ALLOWED_NETWORKS",
        http_setting="MANTA_CODE_SOURCE_ALLOW_PLAIN",
        schemes=GIT_SCHEMES,
        plain_schemes=PLAIN_GIT_SCHEMES,
        allow_user=True,
    )

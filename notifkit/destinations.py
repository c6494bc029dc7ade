"""Which network addresses a webhook may reach, and how a contact's address is spelled.

A webhook's URL is chosen by a tenant, and the request goes out from inside the deployment: a
URL naming a loopback, private, link-local (the cloud metadata service at 169.254.169.254) or
otherwise internal address would let any API key make notifkit call services that are not
meant to be reachable from outside (server-side request forgery). Unless
``WEBHOOK_ALLOW_PRIVATE_NETWORKS`` is set, only public unicast addresses are allowed: the API
refuses a contact whose URL names a refused address literally, and the webhook transport checks
every address a name resolves to before it connects, so a name that resolves elsewhere later
(DNS rebinding) is refused too.

The ranges are listed here rather than taken from :mod:`ipaddress`'s ``is_global``, whose
meaning has changed between Python releases (IPv4 multicast is "global" to it).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Final

from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

LOOPBACK: Final = "loopback"
PRIVATE: Final = "private"
LINK_LOCAL: Final = "link-local"
SHARED: Final = "carrier-grade NAT"
MULTICAST: Final = "multicast"
UNSPECIFIED: Final = "unspecified"
RESERVED: Final = "reserved"

_V4: Final[tuple[tuple[ipaddress.IPv4Network, str], ...]] = tuple(
    (ipaddress.IPv4Network(network), kind) for network, kind in (
        ("0.0.0.0/8", UNSPECIFIED),  # "this network": 0.0.0.0 connects to the local host
        ("10.0.0.0/8", PRIVATE),
        ("100.64.0.0/10", SHARED),
        ("127.0.0.0/8", LOOPBACK),
        ("169.254.0.0/16", LINK_LOCAL),
        ("172.16.0.0/12", PRIVATE),
        ("192.0.0.0/24", RESERVED),  # IETF protocol assignments
        ("192.0.2.0/24", RESERVED),  # documentation
        ("192.88.99.0/24", RESERVED),  # 6to4 relay anycast
        ("192.168.0.0/16", PRIVATE),
        ("198.18.0.0/15", RESERVED),  # benchmarking
        ("198.51.100.0/24", RESERVED),  # documentation
        ("203.0.113.0/24", RESERVED),  # documentation
        ("224.0.0.0/4", MULTICAST),
        ("240.0.0.0/4", RESERVED),  # future use, and the broadcast address
    )
)
_V6: Final[tuple[tuple[ipaddress.IPv6Network, str], ...]] = tuple(
    (ipaddress.IPv6Network(network), kind) for network, kind in (
        ("::/128", UNSPECIFIED),
        ("::1/128", LOOPBACK),
        ("64:ff9b:1::/48", PRIVATE),  # local-use NAT64
        ("100::/64", RESERVED),  # discard
        ("2001::/23", RESERVED),  # IETF protocol assignments, Teredo among them
        ("2001:db8::/32", RESERVED),  # documentation
        ("fc00::/7", PRIVATE),  # unique-local
        ("fe80::/10", LINK_LOCAL),
        ("fec0::/10", PRIVATE),  # site-local (deprecated, still routed inside some sites)
        ("ff00::/8", MULTICAST),
    )
)
_GLOBAL_UNICAST_V6: Final = ipaddress.IPv6Network("2000::/3")
# Prefixes whose addresses carry an IPv4 address that a gateway connects to.
_NAT64: Final = ipaddress.IPv6Network("64:ff9b::/96")
_SIX_TO_FOUR: Final = ipaddress.IPv6Network("2002::/16")
# A host name the C resolver reads as an IPv4 address: dotted, decimal, octal or hex parts
# (127.1, 2130706433, 0x7f.0.0.1).
_NUMERIC_HOST: Final = re.compile(r"^[0-9a-fx.]+$", re.IGNORECASE)


def refused_kind(address: IPAddress) -> str | None:
    """What kind of non-public address ``address`` is (``"private"``, ``"loopback"``, ...),
    or None when it is a public unicast address a webhook may reach."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_v4(address)
        if embedded is not None:
            return refused_kind(embedded)
        for network6, kind in _V6:
            if address in network6:
                return kind
        return None if address in _GLOBAL_UNICAST_V6 else RESERVED
    for network4, kind in _V4:
        if address in network4:
            return kind
    return None


def _embedded_v4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches: IPv4-mapped (which the socket layer connects to
    as IPv4), NAT64 and 6to4."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def host_address(host: str) -> IPAddress | None:
    """The address ``host`` (a URL's host name, IPv6 without brackets) spells literally, in any
    form the system resolver accepts as an address; None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if _NUMERIC_HOST.match(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def refused_host(host: str) -> str | None:
    """Why a webhook may not name ``host`` literally (an address or ``localhost``), or None."""
    lowered = host.lower().rstrip(".")
    # RFC 6761: localhost and every name under it are loopback, whatever DNS says.
    if lowered == "localhost" or lowered.endswith(".localhost"):
        return f"{host} is a {LOOPBACK} host"
    address = host_address(lowered)
    if address is None:
        return None
    kind = refused_kind(address)
    if kind is None:
        return None
    return f"{host} is {'an' if kind[0] in 'aeiou' else 'a'} {kind} address"


def ascii_domain(domain: str) -> str:
    """``domain`` lower-cased, an international one (IDNA) in its ASCII form (``bücher.de``
    is ``xn--bcher-kva.de``), as providers send to it and bounces name it; as it came,
    lower-cased, when it has no such form."""
    if domain.isascii():
        return domain.lower()
    try:
        return URL.build(scheme="https", host=domain).raw_host or domain.lower()
    except (ValueError, UnicodeError):
        return domain.lower()


def normalise_contact(channel: str, target: str) -> str:
    """The stored spelling of a contact or suppressed address: e-mail domains are
    case-insensitive, so they are lower-cased (an international one in its ASCII form).
    Suppressions match contacts by equality, so every writer of either spells them this way.
    A webhook URL's scheme and host are case-insensitive too and 443 is https's own port, so
    one endpoint is one contact (and gets each notification once) however it is spelled."""
    if channel == "email" and "@" in target:
        local, _, domain = target.rpartition("@")
        return f"{local}@{ascii_domain(domain)}"
    if channel == "webhook":
        return _normalise_url(target)
    return target


def _normalise_url(url: str) -> str:
    scheme, separator, rest = url.partition("://")
    if not separator:
        return url
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, hostport = authority.rpartition("@")
    # An IPv6 host is bracketed and holds colons of its own; the port follows the bracket.
    split = hostport.find("]") + 1 if hostport.startswith("[") else hostport.find(":")
    host, port = (hostport, "") if split <= 0 else (hostport[:split], hostport[split:])
    if scheme.lower() == "https" and port in (":", ":443"):
        port = ""
    return f"{scheme.lower()}://{userinfo}{at}{host.lower()}{port}{tail}"

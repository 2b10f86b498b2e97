"""Which addresses are not "the internet": the address rules of the egress policy.

Pure functions over `ipaddress` plus one system question (is an address this
machine's own?), so the guardian can judge a literal host without DNS and the
transport and proxy can judge every resolved address the same way.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from functools import cache

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Cloud metadata services (AWS/GCP/Azure/Oracle/OpenStack, AWS over IPv6, Alibaba, Azure's
#: wire server): they hand out credentials to whoever asks from the machine.
METADATA = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "168.63.129.16")
)

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_RFC1918 = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_ULA = ipaddress.ip_network("fc00::/7")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
#: What `inet_aton` reads as an IPv4 address: 2130706433, 0x7f000001, 0177.1, 127.1 ...
_IPV4_FORMS = re.compile(r"[0-9a-fA-FxX.]+")
#: A host name as DNS allows it (letters, digits, hyphen, underscore, dots); IDNs arrive
#: here already in their xn-- form.
_HOSTNAME = re.compile(
    r"(?=.{1,253}\Z)([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.)*"
    r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.?"
)


def normal_host(host: str) -> str:
    """Lower case, no brackets, no trailing dot: the form hosts are compared in."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") and not host.endswith("..") else host


def valid_host(host: str) -> bool:
    """A host name or IP literal and nothing else: no NUL, spaces, `%`, `@`, `/` ..."""
    if not host or len(host) > 253:
        return False
    if literal_ip(host) is not None:
        return True
    return _HOSTNAME.fullmatch(host) is not None


def literal_ip(host: str) -> IPAddress | None:
    """The address a host written as an IP literal stands for, in any form a resolver
    accepts (dotted, decimal, hex, octal, shortened IPv4; IPv6 with or without brackets,
    without a zone); None for a name."""
    host = normal_host(host)
    if not host:
        return None
    if ":" in host:
        if "%" in host:  # a zone id (fe80::1%eth0): link-local, never needed here
            host = host.split("%", 1)[0]
        try:
            return ipaddress.IPv6Address(host)
        except ValueError:
            return None
    if _IPV4_FORMS.fullmatch(host) is None:
        return None
    try:
        packed = socket.inet_aton(host)
    except OSError:
        return None
    return ipaddress.IPv4Address(packed)


def embedded_v4(ip: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address inside an IPv4-mapped, NAT64 or 6to4 IPv6 address, if any."""
    if isinstance(ip, ipaddress.IPv4Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour is not None:
        return ip.sixtofour
    # ::a.b.c.d (IPv4-compatible, deprecated) — still reaches a.b.c.d on some stacks.
    if int(ip) >> 32 == 0 and int(ip) > 1:
        return ipaddress.IPv4Address(int(ip))
    return None


def unmapped(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address as the IPv4 address it is; anything else as is."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def special(ip: IPAddress) -> str | None:
    """What kind of non-public address `ip` is ("a loopback address (this machine)"), or
    None for an ordinary public address. Embedded IPv4 forms are judged by the IPv4
    address they carry."""
    inner = embedded_v4(ip)
    if inner is not None:
        kind = special(inner)
        return f"{kind} ({inner} inside an IPv6 address)" if kind else None
    if ip in METADATA:
        return "a cloud metadata service (it hands out this machine's credentials)"
    if ip.is_loopback:
        return "a loopback address (this machine)"
    if ip.is_unspecified or (isinstance(ip, ipaddress.IPv4Address) and ip in _THIS_NETWORK):
        return "an unspecified address (this machine)"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if isinstance(ip, ipaddress.IPv4Address):
        if ip in _CGNAT:
            return "a carrier-grade NAT address (100.64.0.0/10)"
        if any(ip in net for net in _RFC1918):
            return "a private network address"
    elif ip in _ULA:
        return "a private network address (IPv6 ULA)"
    elif ip.is_site_local:
        return "a site-local address"
    if ip.is_reserved or ip.is_private or not ip.is_global:
        return "a reserved or special-purpose address"
    return None


# ── this machine's own addresses ─────────────────────────────────────────────────


@cache
def _binds_anything(family: int) -> bool:
    """True when this host lets a socket bind an address it does not have (Linux's
    ip_nonlocal_bind sysctl): then a bind says nothing and the tables are read."""
    name = "ipv4" if family == socket.AF_INET else "ipv6"
    try:
        with open(f"/proc/sys/net/{name}/ip_nonlocal_bind", encoding="ascii") as f:
            return f.read().strip() not in ("", "0")
    except OSError:
        return False


def _bind_ok(family: int, address: str) -> bool:
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.bind((address, 0))
    except OSError:
        return False
    return True


def _table_addresses() -> set[IPAddress]:
    """This host's addresses from /proc: the LOCAL entries of the IPv4 FIB and the
    IPv6 interface list."""
    found: set[IPAddress] = set()
    try:
        last = ""
        with open("/proc/net/fib_trie", encoding="ascii") as f:
            for line in f:
                text = line.strip()
                if text.startswith("|--"):
                    last = text[3:].strip()
                elif "host LOCAL" in text and last:
                    found.add(ipaddress.IPv4Address(last))
    except (OSError, ValueError):
        pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as f:
            for line in f:
                hexa = line.split()[0] if line.split() else ""
                if len(hexa) == 32:
                    found.add(ipaddress.IPv6Address(int(hexa, 16)))
    except (OSError, ValueError):
        pass
    return found


def own_address(ip: IPAddress) -> bool:
    """Whether `ip` is an address of this machine: one a socket here can bind to."""
    ip = unmapped(ip)
    family = socket.AF_INET if isinstance(ip, ipaddress.IPv4Address) else socket.AF_INET6
    if ip.is_unspecified or ip.is_loopback:
        return True
    if _binds_anything(family):
        return ip in _table_addresses()
    return _bind_ok(family, str(ip))

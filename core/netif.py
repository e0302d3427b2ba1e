"""Which of this host's network interfaces reaches a peer: what gloo needs on several nodes.

gloo binds each rank to the address its host name resolves to unless ``GLOO_SOCKET_IFNAME``
names an interface (PyTorch's ``torch.distributed`` docs, "Common environment variables"). On
many hosts the name resolves to a loopback address (Debian writes ``127.0.1.1 <hostname>``),
and a rank bound there cannot be reached from another node: gloo's full mesh then fails with
"Connection refused". :func:`interface_to` finds the interface instead, from the route to the
job's master address (:func:`core.distributed.init` sets ``GLOO_SOCKET_IFNAME`` with it).
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address
_PROBE_PORT = 9       # any port: connecting a UDP socket sends nothing


def resolve(host: str) -> str | None:
    """``host``'s IPv4 address, or None if it does not resolve."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` resolves to a loopback address (reachable from this host only)."""
    address = resolve(host)
    return address is not None and ipaddress.ip_address(address).is_loopback


def local_address_to(host: str) -> str | None:
    """The address of this host that the kernel uses to reach ``host`` (``host``'s own if it
    is this host's); None if ``host`` does not resolve or cannot be routed to."""
    address = resolve(host)
    if address is None:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((address, _PROBE_PORT))
        except OSError:
            return None
        return str(probe.getsockname()[0])


def address_of(interface: str) -> str | None:
    """The IPv4 address of ``interface``, or None if it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR,
                                 struct.pack("256s", interface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_to(host: str) -> str | None:
    """The interface that holds the address this host reaches ``host`` from; None where that
    is a loopback address (``host`` is this host, by a loopback name) or nothing matches."""
    local = local_address_to(host)
    if local is None or ipaddress.ip_address(local).is_loopback:
        return None
    return next((name for _, name in socket.if_nameindex() if address_of(name) == local), None)

"""Choosing the address a worker listens on (DL4J's ``networkMask`` / ``DL4J_VOID_IP``)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Callable

from sparkdl.errors import CommunicationError, ConfigurationError

ENV_IP = "SPARKDL_IP"
_SIOCGIFCONF = 0x8912
_IFREQ_BYTES = 40  # struct ifreq on 64-bit Linux: 16-byte name + 24-byte union


def _ioctl_ipv4_addresses() -> list[str]:
    """IPv4 addresses of every configured interface (aliases included), via SIOCGIFCONF."""
    import array
    import fcntl

    slots = 128
    buf = array.array("B", bytes(slots * _IFREQ_BYTES))
    addr, _ = buf.buffer_info()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("iL", len(buf), addr)
        res = fcntl.ioctl(sock.fileno(), _SIOCGIFCONF, req)
    used = struct.unpack("iL", res)[0]
    data = buf.tobytes()
    found = []
    for off in range(0, used, _IFREQ_BYTES):
        family = struct.unpack_from("H", data, off + 16)[0]
        if family == socket.AF_INET:
            found.append(socket.inet_ntoa(data[off + 20 : off + 24]))
    return found


def local_addresses() -> list[str]:
    """Every local IP address this module can find, without duplicates."""
    found: list[str] = []
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, struct.error, ImportError):
            found += _ioctl_ipv4_addresses()
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None):
            found.append(str(info[4][0]))
    found.append("127.0.0.1")
    return list(dict.fromkeys(a.split("%")[0] for a in found))


def select_bind_address(network_mask: str | None = None, default: str | None = None) -> str:
    """``$SPARKDL_IP`` if set; else the local address inside ``network_mask`` (CIDR); else
    ``default`` or ``127.0.0.1``."""
    env = os.environ.get(ENV_IP, "").strip()
    if env:
        try:
            ipaddress.ip_address(env)
        except ValueError as exc:
            raise ConfigurationError(f"{ENV_IP}: expected an IP address, got {env!r}") from exc
        return env
    if network_mask:
        try:
            network = ipaddress.ip_network(network_mask, strict=False)
        except ValueError as exc:
            raise ConfigurationError(
                f"network_mask: expected CIDR like '10.0.0.0/8', got {network_mask!r}"
            ) from exc
        addresses = local_addresses()
        for text in addresses:
            with contextlib.suppress(ValueError):
                if ipaddress.ip_address(text) in network:
                    return text
        raise ConfigurationError(
            f"network_mask: no local address inside {network_mask}; found {addresses}"
        )
    return default or "127.0.0.1"


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` (an IPv6 host may be in brackets) as ``(host, port)``; ``ValueError``
    naming the text when it is not one. Every parser of an address in sparkdl is this one."""
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected 'host:port', got {address!r}")
    return host.strip("[]"), int(port)


def parse_port_range(text: str | None) -> tuple[int, int] | None:
    """Parse ``"40000-40100"`` or ``"40000"``; ``None`` or empty means any free port."""
    if text is None or not str(text).strip():
        return None
    lo_text, _, hi_text = str(text).strip().partition("-")
    try:
        lo = int(lo_text)
        hi = int(hi_text) if hi_text else lo
    except ValueError as exc:
        raise ConfigurationError(
            f"port range: expected 'LOW-HIGH' or 'PORT', got {text!r}"
        ) from exc
    if not 1 <= lo <= hi <= 65535:
        raise ConfigurationError(f"port range: expected 1 <= LOW <= HIGH <= 65535, got {text!r}")
    return lo, hi


def listen_on(
    host: str,
    port_range: tuple[int, int] | None,
    *,
    configure: Callable[[socket.socket], None] | None = None,
    backlog: int = 64,
) -> socket.socket:
    """A listening TCP socket on ``host`` at the first free port of ``port_range`` (any free
    port when ``None``); ``configure`` tunes the socket before it binds."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    ports = range(port_range[0], port_range[1] + 1) if port_range else [0]
    last: OSError | None = None
    for port in ports:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if configure is not None:
                configure(sock)
            sock.bind((host, port))
            sock.listen(backlog)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise CommunicationError(f"cannot listen on {host} port range {port_range}: {last}")

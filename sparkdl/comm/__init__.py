"""Rendezvous and collectives (allgather, allreduce, broadcast, barrier) over numpy buffers.

Nothing here imports Spark or TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkdl.comm.communicator import Communicator, TrafficCounters
from sparkdl.comm.network import local_addresses, parse_port_range, select_bind_address
from sparkdl.comm.rendezvous import TcpStoreServer, store_exchange
from sparkdl.comm.rpc import AllGatherCommunicator
from sparkdl.comm.tcp import TcpRingCommunicator, connect_ring
from sparkdl.errors import ConfigurationError

TRANSPORTS = ("tcp", "spark")

__all__ = [
    "TRANSPORTS",
    "AllGatherCommunicator",
    "Communicator",
    "TcpRingCommunicator",
    "TcpStoreServer",
    "TrafficCounters",
    "connect_ring",
    "create_communicator",
    "local_addresses",
    "parse_port_range",
    "select_bind_address",
    "store_exchange",
]


def create_communicator(
    transport: str,
    rank: int,
    world_size: int,
    exchange: Callable[[str], list[str]],
    *,
    secret: bytes,
    timeout_s: float,
    network_mask: str | None = None,
    default_host: str | None = None,
    port_range: tuple[int, int] | str | None = None,
    wire_integrity: str = "none",
) -> Communicator:
    """Build the communicator for ``transport``: ``"tcp"`` (direct ring between workers,
    addresses exchanged through ``exchange``) or ``"spark"`` (everything through
    ``exchange``). ``wire_integrity="mac"`` puts a keyed MAC (from ``secret``) on every
    frame or message after the handshake and verifies it before use (``cluster.wire_integrity``).
    """
    if transport == "tcp":
        host = select_bind_address(network_mask, default_host)
        ports = parse_port_range(port_range) if isinstance(port_range, str) else port_range
        return connect_ring(
            rank,
            world_size,
            exchange,
            secret=secret,
            timeout_s=timeout_s,
            bind_host=host,
            port_range=ports,
            wire_integrity=wire_integrity,
        )
    if transport == "spark":
        return AllGatherCommunicator(
            rank,
            world_size,
            exchange,
            timeout_s=timeout_s,
            secret=secret,
            wire_integrity=wire_integrity,
        )
    raise ConfigurationError(f"transport: expected one of {list(TRANSPORTS)}, got {transport!r}")

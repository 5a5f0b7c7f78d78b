"""Rendezvous and collectives (allgather, allreduce, broadcast, barrier) over numpy buffers.

Nothing here imports Spark or TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sparkdl.comm.communicator import Communicator, TrafficCounters
from sparkdl.comm.hierarchical import (
    TOPOLOGIES,
    HierarchicalCommunicator,
    check_hosts,
    connect_hierarchical,
    wants_hierarchy,
)
from sparkdl.comm.mesh import MESH_MODES, MeshCommunicator, connect_mesh
from sparkdl.comm.network import local_addresses, parse_port_range, select_bind_address
from sparkdl.comm.rendezvous import TcpStoreServer, store_exchange
from sparkdl.comm.rpc import AllGatherCommunicator
from sparkdl.comm.tcp import TcpRingCommunicator, connect_ring
from sparkdl.errors import ConfigurationError

TRANSPORTS = ("tcp", "spark")

__all__ = [
    "MESH_MODES",
    "TOPOLOGIES",
    "TRANSPORTS",
    "AllGatherCommunicator",
    "Communicator",
    "HierarchicalCommunicator",
    "MeshCommunicator",
    "TcpRingCommunicator",
    "TcpStoreServer",
    "TrafficCounters",
    "connect_hierarchical",
    "connect_mesh",
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
    topology: str = "flat",
    host_id: str | None = None,
    mesh: str = "plain",
    hosts: Sequence[str] | None = None,
) -> Communicator:
    """Build the communicator for ``transport``: ``"tcp"`` (direct ring between workers,
    addresses exchanged through ``exchange``) or ``"spark"`` (everything through
    ``exchange``). ``wire_integrity="mac"`` puts a keyed MAC (from ``secret``) on every
    frame or message after the handshake and verifies it before use (``cluster.wire_integrity``).

    ``topology`` (``cluster.topology``, TCP only): ``"flat"`` one ring of all ranks;
    ``"hierarchical"`` one ring per host plus one of the hosts' leaders
    (:class:`~sparkdl.comm.hierarchical.HierarchicalCommunicator`); ``"auto"`` hierarchical
    when there is more than one host and some host runs two ranks or more. A rank's host is
    ``host_id`` (default: its bind address, e.g. the executor's host address); learning the
    hosts takes one more round of ``exchange`` unless the topology is flat, or unless the
    caller knows every rank's host: ``hosts`` (``hosts[r]`` rank ``r``'s, the same list on
    every rank, e.g. a Spark barrier stage's task addresses; a list of another length is a
    :class:`ConfigurationError`, whatever the topology).

    ``mesh`` (``cluster.mesh``, TCP only; DL4J's ``MeshBuildMode``): ``"plain"`` the ring;
    ``"mesh"`` log-depth allgather, broadcast and allreduce over extra links
    (:mod:`sparkdl.comm.mesh`, their ports sent with the ring's address) for messages up to
    64 MiB, the ring above; ``"auto"`` those for
    small messages at four ranks or more, the ring otherwise. With a hierarchical topology it
    applies to each ring (per host and the leaders').
    """
    if mesh not in MESH_MODES:
        raise ConfigurationError(f"mesh: expected one of {list(MESH_MODES)}, got {mesh!r}")
    if topology not in TOPOLOGIES:
        raise ConfigurationError(f"topology: expected one of {list(TOPOLOGIES)}, got {topology!r}")
    if hosts is not None:  # checked whatever the topology needs of them
        check_hosts(hosts, world_size)
    if transport == "tcp":
        host = select_bind_address(network_mask, default_host)
        ports = parse_port_range(port_range) if isinstance(port_range, str) else port_range

        def ring(r: int, size: int, ring_exchange: Callable[[str], list[str]]) -> Communicator:
            return connect_mesh(
                r,
                size,
                ring_exchange,
                secret=secret,
                timeout_s=timeout_s,
                bind_host=host,
                port_range=ports,
                wire_integrity=wire_integrity,
                mode=mesh,
            )

        if topology == "flat" or world_size == 1:
            return ring(rank, world_size, exchange)
        if hosts is None:
            hosts = exchange(host_id or host)
        if not wants_hierarchy(topology, hosts):
            return ring(rank, world_size, exchange)
        return connect_hierarchical(rank, world_size, exchange, ring, hosts=hosts,
                                    timeout_s=timeout_s)
    if topology == "hierarchical":
        raise ConfigurationError(
            f"topology 'hierarchical' needs transport 'tcp', not {transport!r} (every message "
            "already goes through Spark's driver)"
        )
    if mesh == "mesh":
        raise ConfigurationError(
            f"mesh 'mesh' needs transport 'tcp', not {transport!r} (every message already goes "
            "through Spark's driver)"
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

"""Rendezvous store, the Spark-RPC (allgather-only) transport, address selection."""

from __future__ import annotations

import contextlib
import socket
import threading

import numpy as np
import pytest
from _comm_harness import SECRET, run_ranks, values

from sparkdl.comm import (
    AllGatherCommunicator,
    TcpStoreServer,
    connect_ring,
    create_communicator,
    parse_port_range,
    select_bind_address,
    store_exchange,
)
from sparkdl.comm.rendezvous import _auth
from sparkdl.errors import CommunicationError, ConfigurationError


def _both_transports(rank: int, world: int, exchange) -> dict:
    ring = connect_ring(rank, world, exchange, secret=SECRET, timeout_s=15)
    rpc = AllGatherCommunicator(rank, world, exchange, timeout_s=15)
    out: dict = {}
    exact = np.arange(1001, dtype=np.float32) * (rank + 1)
    noisy = np.random.default_rng(rank).standard_normal(1001)
    for name, comm in (("tcp", ring), ("rpc", rpc)):
        out[name] = {
            "exact": comm.allreduce(exact).tobytes(),
            "mean": comm.allreduce(exact, op="mean").tobytes(),
            "noisy": comm.allreduce(noisy),
            "gather": comm.allgather(b"r" * rank),
            "bcast": comm.broadcast(b"root-2" if rank == 2 else None, root=2),
        }
        comm.barrier()
    rpc.close()
    ring.close()
    out["rpc_counters"] = rpc.counters.snapshot()
    return out


def test_allgather_transport_matches_tcp() -> None:
    results = values(run_ranks(_both_transports, 3, timeout=60))
    for res in results:
        tcp, rpc = res["tcp"], res["rpc"]
        assert tcp["exact"] == rpc["exact"] == results[0]["rpc"]["exact"]
        assert tcp["mean"] == rpc["mean"]
        assert np.allclose(tcp["noisy"], rpc["noisy"], rtol=1e-12)
        assert rpc["noisy"].tobytes() == results[0]["rpc"]["noisy"].tobytes()
        assert tcp["gather"] == rpc["gather"] == [b"", b"r", b"rr"]
        assert tcp["bcast"] == rpc["bcast"] == b"root-2"
        assert min(res["rpc_counters"]) > 0


def test_allgather_transport_detects_desync() -> None:
    def exchange(value: str) -> list[str]:
        return [value, "sdl1|barrier|0|"]

    comm = AllGatherCommunicator(0, 2, exchange)
    with pytest.raises(CommunicationError, match="rank 1 is out of step"):
        comm.allgather(b"x")


def test_store_round_trips_and_names_missing_ranks() -> None:
    with TcpStoreServer(SECRET) as server:
        ex = [store_exchange(server.address, r, 2, secret=SECRET, timeout_s=5) for r in (0, 1)]
        out: list = [None, None]
        for round_ in range(3):
            threads = [
                threading.Thread(target=lambda r=r, k=round_: out.__setitem__(r, ex[r](f"{r}-{k}")))
                for r in (0, 1)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            assert out == [[f"0-{round_}", f"1-{round_}"]] * 2
        lonely = store_exchange(server.address, 0, 2, key="other", secret=SECRET, timeout_s=0.5)
        # it gives up by its own 0.5 s bound (named), not the server's or pytest's
        with pytest.raises(CommunicationError, match=r"ranks \[1\] did not join .* within 0\.5 s"):
            lonely("alone")


def test_store_rejects_wrong_secret_and_garbage() -> None:
    with TcpStoreServer(SECRET) as server:
        bad = store_exchange(server.address, 0, 1, secret=b"x" * 32, timeout_s=2)
        with pytest.raises(CommunicationError):
            bad("v")
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as raw:
            raw.sendall(b"\x00" * 500)
            raw.settimeout(5)
            assert raw.recv(100).startswith(_auth.MAGIC)  # the challenge, then EOF
            # then closed (unread garbage left behind turns the close into a reset)
            with contextlib.suppress(ConnectionResetError):
                assert raw.recv(100) == b""
        good = store_exchange(server.address, 0, 1, secret=SECRET, timeout_s=2)
        assert good("v") == ["v"]


def test_select_bind_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKDL_IP", "10.1.2.3")
    assert select_bind_address("127.0.0.0/8") == "10.1.2.3"
    monkeypatch.delenv("SPARKDL_IP")
    assert select_bind_address("127.0.0.0/8").startswith("127.")
    with pytest.raises(ConfigurationError, match=r"no local address inside 203\.0\.113\.0/24"):
        select_bind_address("203.0.113.0/24")
    with pytest.raises(ConfigurationError):
        select_bind_address("not-a-mask")
    assert select_bind_address(None, "192.0.2.7") == "192.0.2.7"
    assert select_bind_address() == "127.0.0.1"
    monkeypatch.setenv("SPARKDL_IP", "not-an-ip")
    with pytest.raises(ConfigurationError, match="SPARKDL_IP"):
        select_bind_address()


def test_parse_port_range() -> None:
    assert parse_port_range("40000-40100") == (40000, 40100)
    assert parse_port_range("40000") == (40000, 40000)
    assert parse_port_range(None) is None and parse_port_range(" ") is None
    for bad in ("a-b", "5-4", "0", "70000"):
        with pytest.raises(ConfigurationError):
            parse_port_range(bad)


def test_create_communicator_rejects_unknown_transport() -> None:
    with pytest.raises(ConfigurationError, match="'carrier-pigeon'"):
        create_communicator("carrier-pigeon", 0, 1, lambda s: [s], secret=SECRET, timeout_s=1)
    comm = create_communicator("spark", 0, 1, lambda s: [s], secret=SECRET, timeout_s=1)
    assert comm.allgather(b"z") == [b"z"]


def _port_range_ring(rank: int, world: int, exchange, ports: str) -> float:
    comm = create_communicator(
        "tcp",
        rank,
        world,
        exchange,
        secret=SECRET,
        timeout_s=10,
        network_mask="127.0.0.0/8",
        port_range=ports,
    )
    value = float(comm.allreduce(np.ones(3))[0])
    comm.close()
    return value


def test_create_communicator_tcp_with_port_range() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]
    ports = f"{base}-{base + 20}"
    assert values(run_ranks(_port_range_ring, 2, args=(ports,), timeout=30)) == [2.0, 2.0]

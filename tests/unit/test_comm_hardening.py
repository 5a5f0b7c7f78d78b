"""The communication layer against hostile or broken peers (issue 11, findings 5-9): floods of
connections, huge declared lengths, trickling peers, killed shared-memory senders, and bytes
injected into an authenticated stream. Everything runs on 127.0.0.1 with real sockets."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from _comm_harness import SECRET, FakeRank1, run_in_child, run_ranks, start_process, values

from sparkdl.comm import _shm, create_communicator
from sparkdl.comm.rendezvous import store_exchange
from sparkdl.comm.tcp import connect_ring
from sparkdl.comm.tcp.frames import _HDR, _MAGIC, _OP_ALLGATHER, _OP_ALLREDUCE_F32
from sparkdl.errors import CommunicationError, ConfigurationError

ROOT = Path(__file__).resolve().parents[2]

# 5. Listeners that survive a flood -------------------------------------------------------------

_FLOODED_RANK0 = """
import resource, sys
import numpy as np
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, hard))
from sparkdl.comm.rendezvous import TcpStoreServer, store_exchange
from sparkdl.comm.tcp import connect_ring
secret = {secret!r}
store = TcpStoreServer(secret)
store_ex = store_exchange(store.address, 0, 2, secret=secret, timeout_s=20)

def exchange(value):
    print("ADDR", store.address, value, flush=True)
    sys.stdin.readline()  # the test floods both listeners, stops, then says go
    return store_ex(value)

comm = connect_ring(0, 2, exchange, secret=secret, timeout_s=20, shared_memory=False)
out = comm.allreduce(np.arange(1000, dtype=np.float32))
print("RESULT", float(out.sum()), flush=True)
comm.close()
store.close()
"""


def _flood(host: str, port: int, count: int) -> list[socket.socket]:
    """Open up to ``count`` idle connections (stops at the first that the backlog refuses)."""
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(0.3)
        try:
            sock.connect((host, port))
        except OSError:
            sock.close()
            break
        socks.append(sock)
    return socks


def test_ring_and_store_keep_accepting_after_running_out_of_file_descriptors() -> None:
    limit = 48
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-c", _FLOODED_RANK0.format(limit=limit, secret=SECRET)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    flood: list[socket.socket] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        line = proc.stdout.readline()
        assert line.startswith("ADDR"), (line, proc.stderr.read() if proc.stderr else "")
        _, store_address, ring_address = line.split()
        for address in (ring_address, store_address):
            host, _, port = address.rpartition(":")
            flood += _flood(host, int(port), 3 * limit)
        assert len(flood) > 2 * limit  # far past the listener process's open-file limit
        time.sleep(1.0)  # both accept loops hit EMFILE now
        for sock in flood:
            sock.close()
        flood.clear()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        exchange = store_exchange(store_address, 1, 2, secret=SECRET, timeout_s=20)
        comm = connect_ring(1, 2, exchange, secret=SECRET, timeout_s=20, shared_memory=False)
        out = comm.allreduce(np.ones(1000, np.float32))
        comm.close()
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        for sock in flood:
            sock.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    expected = np.arange(1000, dtype=np.float32) + 1
    np.testing.assert_array_equal(out, expected)
    assert f"RESULT {float(expected.sum())}" in stdout, stderr
    assert proc.returncode == 0, stderr
    assert "backing off" in stderr  # the exhaustion was logged, by both listeners
    assert "ring:" in stderr and "store:" in stderr


def test_unauthenticated_connections_are_bounded_oldest_dropped_first() -> None:
    from sparkdl.comm._accept import AcceptLoop

    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    port = listener.getsockname()[1]
    handlers = []

    def handle(conn: socket.socket, addr: object) -> None:  # an idle client's handshake
        handlers.append(threading.current_thread())
        conn.settimeout(10)
        with contextlib.suppress(OSError):
            conn.recv(1)
        conn.close()

    loop = AcceptLoop(listener, handle, what="test", max_pending=4)
    loop.start()
    clients = []
    try:
        for _ in range(10):
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        deadline = time.monotonic() + 5
        while loop.dropped < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert loop.dropped == 6
        for client in clients[:6]:  # the oldest were shut down ...
            client.settimeout(5)
            assert client.recv(1) == b""
        for client in clients[6:]:  # ... the newest are still waiting in their handshake
            client.settimeout(0.1)
            with pytest.raises(TimeoutError):
                client.recv(1)
        time.sleep(0.1)
        assert sum(t.is_alive() for t in handlers) == 4
    finally:
        for client in clients:
            client.close()
        loop.stop()


# 6. A declared length is never allocated before the bytes arrive --------------------------------


def _declare_huge_allgather(length: int) -> tuple:
    fake = FakeRank1()
    comm = connect_ring(0, 2, fake.exchange, secret=SECRET, timeout_s=3, shared_memory=False)
    fake.wait()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fake.to_real.sendall(_HDR.pack(_MAGIC, _OP_ALLGATHER, 0, 0, length) + b"x" * 1000)
    try:
        comm.allgather(b"hello")
        error = "no error"
    except CommunicationError as exc:
        error = f"CommunicationError: {exc}"
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    closed = comm._prev.fileno() == -1 and comm._next.fileno() == -1
    try:
        comm.allgather(b"again")
        after = "no error"
    except CommunicationError as exc:
        after = str(exc)
    fake.close()
    comm.close()
    return error, grown_mib, closed, after


@pytest.mark.parametrize("length", [1 << 30, 1 << 36])
def test_a_huge_declared_length_is_not_allocated_and_fails_cleanly(length: int) -> None:
    error, grown_mib, closed, after = run_in_child(_declare_huge_allgather, length, timeout=30)
    assert error.startswith("CommunicationError: rank 0: "), error
    assert "rank 1 (127.0.0.1:" in error, error
    # it waited for the declared bytes under its own 3 s bound, counting what came
    assert f"sent 1000 of {length} bytes" in error and "not complete within 3.0 s" in error, error
    assert grown_mib < 64, f"{grown_mib:.0f} MiB allocated for a {length}-byte declaration"
    assert closed, "the sockets of a failed communicator stay open"
    assert "unusable after an earlier failure" in after, after


def _out_of_memory_while_receiving() -> tuple[str, bool, str]:
    fake = FakeRank1()
    comm = connect_ring(0, 2, fake.exchange, secret=SECRET, timeout_s=10, shared_memory=False)
    fake.wait()
    length = 256 << 20
    payload = bytes(length)  # really sent: the receiver's buffer grows until memory runs out

    def send() -> None:
        with contextlib.suppress(OSError):
            fake.to_real.sendall(_HDR.pack(_MAGIC, _OP_ALLGATHER, 0, 0, length))
            fake.to_real.sendall(payload)

    with open("/proc/self/statm") as fh:
        vm_bytes = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes + (96 << 20), resource.RLIM_INFINITY))
    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        comm.allgather(b"hello")
        error = "no error"
    except CommunicationError as exc:
        error = f"CommunicationError: {exc}"
    except BaseException as exc:
        error = f"{type(exc).__name__}: {exc}"
    closed = comm._prev.fileno() == -1 and comm._next.fileno() == -1
    try:
        comm.allgather(b"again")
        after = "no error"
    except CommunicationError as exc:
        after = str(exc)
    fake.close()
    thread.join(timeout=5)
    return error, closed, after


def test_running_out_of_memory_while_receiving_is_a_communication_error() -> None:
    error, closed, after = run_in_child(_out_of_memory_while_receiving, timeout=60)
    assert error.startswith("CommunicationError: rank 0: out of memory"), error
    assert "rank 1 (127.0.0.1:" in error, error
    assert closed and "unusable after an earlier failure" in after, after


def _store_declared_gigabyte() -> tuple[float, list[str]]:
    from sparkdl.comm import _auth
    from sparkdl.comm.rendezvous import _CTX, _LEN, TcpStoreServer

    with TcpStoreServer(SECRET) as server:
        host, _, port = server.address.rpartition(":")
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            _auth.authenticate_connector(sock, SECRET, _CTX, 0, 1, time.monotonic() + 5)
            sock.sendall(_LEN.pack(1 << 30) + b'{"key"')
            time.sleep(0.5)
        time.sleep(0.2)
        grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
        exchange = store_exchange(server.address, 0, 1, secret=SECRET, timeout_s=5)
        return grown_mib, exchange("still serving")


def test_store_does_not_allocate_a_declared_frame_length() -> None:
    grown_mib, answer = run_in_child(_store_declared_gigabyte, timeout=30)
    assert answer == ["still serving"]
    assert grown_mib < 64, f"{grown_mib:.0f} MiB allocated for a declared 1 GiB frame"


# 7. Each collective has a total deadline --------------------------------------------------------


def test_a_peer_trickling_bytes_cannot_keep_a_collective_alive() -> None:
    timeout_s = 1.0
    fake = FakeRank1()
    comm = connect_ring(0, 2, fake.exchange, secret=SECRET, timeout_s=timeout_s)
    fake.wait()
    stop = threading.Event()
    nbytes = 500 * 4  # rank 0 first receives chunk 1 of a 1000-float allreduce

    trickled = []

    def trickle() -> None:
        fake.to_real.sendall(_HDR.pack(_MAGIC, _OP_ALLREDUCE_F32, 0, 0, nbytes))
        for _ in range(20):  # bounded: at most 20 bytes over 16 s
            if stop.wait(0.8 * timeout_s):
                return
            try:
                fake.to_real.sendall(b"\0")
            except OSError:
                return
            trickled.append(1)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        with pytest.raises(CommunicationError) as info:
            comm.allreduce(np.ones(1000, np.float32))
        trickled_before_error = len(trickled)
    finally:
        stop.set()
        thread.join(timeout=5)
        fake.close()
        comm.close()
    # one deadline for the whole collective: a byte every 0.8 timeouts does not keep it alive
    # (an idle timeout reset by each byte would wait for all 20)
    assert trickled_before_error < 10, f"{trickled_before_error} trickled bytes kept it alive"
    message = str(info.value)
    assert "rank 1 (127.0.0.1:" in message and "allreduce" in message, message
    assert "within" in message, message


# 8. A sender killed during shared-memory setup leaves nothing in /dev/shm ----------------------


def _ours() -> set[str]:
    return {n for n in os.listdir(_shm.SHM_DIR) if n.startswith("sparkdl-")}


def _connector_until_killed(port: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    _shm.negotiate_connector(sock, True, 2, 4096, time.monotonic() + 60)


def test_segment_of_a_sender_killed_during_setup_is_swept() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    # the sender: creates the segment, then waits for the echo until killed
    sender = start_process(_connector_until_killed, port)
    name = ""
    try:
        listener.settimeout(10)
        conn, _ = listener.accept()
        conn.settimeout(10)
        ident = _shm.host_identity()
        offer = _recv(conn, 4 + 1 + len(ident))
        assert offer[4] == 1
        conn.sendall(b"\x01" + ident)
        length = int.from_bytes(_recv(conn, 2), "little")
        name = _recv(conn, length).decode()
        _recv(conn, 8)
        assert name in _ours()  # the segment exists while the sender waits for our echo
        sender.kill()  # killed in the middle of the setup
        sender.join(timeout=10)
        conn.close()
        assert name in _ours()  # nothing could clean it up: its creator is dead
        # The next link set up on this host sweeps segments whose creator is dead.
        results = values(run_ranks(_shm_ring_sum, 2, timeout=30))
        assert results == [2.0, 2.0]
        assert name not in _ours()
    finally:
        listener.close()
        with_pid = os.path.join(_shm.SHM_DIR, name) if name else ""
        if with_pid and os.path.exists(with_pid):
            os.unlink(with_pid)
        sender.kill()
        sender.join(timeout=10)


def _recv(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        assert part, "connection closed"
        data += part
    return data


def _shm_ring_sum(rank: int, world: int, exchange) -> float:
    comm = connect_ring(rank, world, exchange, secret=SECRET, timeout_s=10)
    assert comm.shared_memory == (True, True)
    out = comm.allreduce(np.ones(1, np.float32))
    comm.close()
    return float(out[0])


def test_sweep_spares_segments_of_live_processes_and_foreign_names() -> None:
    live, mm, _ = _shm._create(8192)  # ours, alive
    foreign = os.path.join(_shm.SHM_DIR, "sparkdl-not-a-tagged-name")
    Path(foreign).write_bytes(b"")
    try:
        _shm.sweep_stale()
        assert live in _ours()
        assert os.path.exists(foreign)
    finally:
        os.unlink(os.path.join(_shm.SHM_DIR, live))
        os.unlink(foreign)
        mm.close()


# 9. Optional MAC on every frame ----------------------------------------------------------------


class _FlippingProxy:
    """A loopback TCP proxy that flips one byte at ``offset`` of the client -> server stream."""

    def __init__(self, upstream_port: int, offset: int) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._upstream = upstream_port
        self._offset = offset
        self.flipped = threading.Event()
        self._socks: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        self._listener.settimeout(20)
        try:
            client, _ = self._listener.accept()
        except OSError:
            return
        server = socket.create_connection(("127.0.0.1", self._upstream), timeout=5)
        self._socks += [client, server]
        threading.Thread(target=self._copy, args=(server, client, False), daemon=True).start()
        self._copy(client, server, True)

    def _copy(self, src: socket.socket, dst: socket.socket, flip: bool) -> None:
        src.settimeout(20)
        seen = 0
        try:
            while True:
                data = bytearray(src.recv(1 << 16))
                if not data:
                    break
                if flip and seen <= self._offset < seen + len(data):
                    data[self._offset - seen] ^= 0x10
                    self.flipped.set()
                seen += len(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._listener.close()
        for sock in self._socks:
            sock.close()
        self._thread.join(timeout=5)


def _through_proxy(
    rank: int, world: int, exchange, integrity: str, ports: tuple[int, int]
) -> tuple[str, bool]:
    """Rank 1 listens on ``ports[0]``; rank 0 reaches it through the proxy on ``ports[1]``."""

    def rewired(value: str) -> list[str]:
        addresses = exchange(value)
        if rank == 0:
            addresses[1] = f"127.0.0.1:{ports[1]}"
        return addresses

    comm = connect_ring(
        rank,
        world,
        rewired,
        secret=SECRET,
        timeout_s=10,
        port_range=(ports[0], ports[0]) if rank == 1 else None,
        shared_memory=False,
        wire_integrity=integrity,
    )
    x = np.arange(100_000, dtype=np.float32) * (rank + 1)
    try:
        out = comm.allreduce(x)
    except CommunicationError as exc:
        return f"error: {exc}", False
    finally:
        comm.close()
    return "ok", bool(np.array_equal(out, np.arange(100_000, dtype=np.float32) * 3))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Rank 0 -> rank 1 stream: handshake (78 bytes), shared-memory offer (37), first frame header
# (16, + 16 with a MAC), then payload: offset 4000 is well inside the first frame's payload.
_FLIP_AT = 4000


@pytest.mark.parametrize("integrity", ["mac", "none"])
def test_a_byte_flipped_in_an_authenticated_stream(integrity: str) -> None:
    upstream = _free_port()
    proxy = _FlippingProxy(upstream, _FLIP_AT)
    try:
        outcomes = run_ranks(_through_proxy, 2, args=(integrity, (upstream, proxy.port)))
    finally:
        proxy.close()
    assert proxy.flipped.is_set()
    if integrity == "mac":
        rank1 = outcomes[1]
        assert rank1.ok, rank1.error
        text, _ = rank1.value
        assert text.startswith("error: rank 1: "), text
        assert "rank 0 (127.0.0.1:" in text and "MAC" in text, text
    else:
        # Documented limitation: without a MAC the flip goes unnoticed and rank 1 returns
        # a wrong sum (rank 0 fails or not, depending on what it received back).
        text, correct = values(outcomes)[1]
        assert text == "ok" and not correct


def _mac_results(rank: int, world: int, exchange) -> list[str]:
    comm = connect_ring(rank, world, exchange, secret=SECRET, timeout_s=10, wire_integrity="mac")
    assert comm.shared_memory == (False, False)  # every byte crosses the authenticated stream
    out = []
    for length in (0, 1, 7, 65_537, 300_001):
        x = np.arange(length, dtype=np.float64) * (rank + 1)
        total = comm.allreduce(x)
        assert np.array_equal(total, np.arange(length) * world * (world + 1) / 2)
        gathered = comm.allgather(bytes([rank]) * (length % 1000 + rank))
        assert gathered == [bytes([r]) * (length % 1000 + r) for r in range(world)]
        out.append(comm.broadcast(b"root says %d" % length if rank == 1 else None, root=1))
    comm.barrier()
    comm.close()
    return [o.decode() for o in out]


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_with_mac_are_correct(world: int) -> None:
    results = values(run_ranks(_mac_results, world, timeout=60))
    assert all(r == results[0] for r in results)


def test_wire_integrity_keyword() -> None:
    with pytest.raises(ConfigurationError, match="wire_integrity"):
        connect_ring(0, 1, lambda s: [s], secret=SECRET, wire_integrity="crc")
    for transport in ("tcp", "spark"):
        comm = create_communicator(
            transport, 0, 1, lambda s: [s], secret=SECRET, timeout_s=1, wire_integrity="mac"
        )
        assert comm.allreduce(np.ones(3)).tolist() == [1.0, 1.0, 1.0]
        comm.close()
    with pytest.raises(ConfigurationError, match="wire_integrity"):
        create_communicator("spark", 0, 1, lambda s: [s], secret=SECRET, timeout_s=1,
                            wire_integrity="sha")


def _rank1_message(array: np.ndarray) -> str:
    """What rank 1 of the spark transport (with MAC) posts for ``allreduce(array)``."""
    from sparkdl.comm import AllGatherCommunicator

    captured: list[str] = []

    def capture(text: str) -> list[str]:
        captured.append(text)
        raise RuntimeError("captured")

    comm = AllGatherCommunicator(1, 2, capture, secret=SECRET, wire_integrity="mac")
    with pytest.raises(CommunicationError):
        comm.allreduce(array)
    return captured[0]


@pytest.mark.parametrize("how", ["intact", "altered", "replayed"])
def test_spark_transport_mac(how: str) -> None:
    from sparkdl.comm import AllGatherCommunicator

    theirs = _rank1_message(np.full(4, 2.0))
    if how == "altered":  # one base64 character of the payload changed
        head, _, tail = theirs.rpartition("|")
        head = head[:-3] + ("A" if head[-3] != "A" else "B") + head[-2:]
        theirs = f"{head}|{tail}"

    def exchange(text: str) -> list[str]:
        return [text, text if how == "replayed" else theirs]

    comm = AllGatherCommunicator(0, 2, exchange, secret=SECRET, wire_integrity="mac")
    if how == "intact":
        assert comm.allreduce(np.ones(4)).tolist() == [3.0] * 4
        return
    with pytest.raises(CommunicationError, match="rank 1 sent a allreduce-float64 message "
                       "that failed its MAC"):
        comm.allreduce(np.ones(4))

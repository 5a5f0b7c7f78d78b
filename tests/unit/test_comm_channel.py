"""The driver's event channel: authenticated, request/reply, bounded, refuses bad frames, survives
idle connections, and detects frames altered, replayed or reordered on the wire."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

import pytest

from sparkdl.comm.channel import ChannelClient, ChannelServer
from sparkdl.errors import CommunicationError

SECRET = b"s" * 32


def _answer(server: ChannelServer, count: int) -> threading.Thread:
    def serve() -> None:
        for _ in range(count):
            message = server.inbox.get(timeout=10)
            if message.wants_reply:
                message.reply({"echo": message.data["n"], "blob": len(message.blob)})

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_requests_get_their_answer_and_one_way_messages_arrive_in_order():
    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=5) as server:
        client = ChannelClient(server.address, SECRET, timeout_s=5)
        client.send({"n": 1})
        thread = _answer(server, 2)
        assert client.request({"n": 2}, b"x" * 1000) == {"echo": 2, "blob": 1000}
        thread.join(5)
        client.close()


def test_a_client_without_the_secret_is_refused_and_never_reaches_the_inbox():
    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=5) as server:
        with pytest.raises(CommunicationError, match="cannot reach the driver"):
            ChannelClient(server.address, b"w" * 32, timeout_s=5)
        time.sleep(0.2)
        assert server.inbox.empty()


def test_an_unanswered_request_fails_within_the_timeout_naming_the_event():
    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=5) as server:
        client = ChannelClient(server.address, SECRET, timeout_s=0.5)
        # the error names the client's own 0.5 s bound, not the server's 5 s one
        with pytest.raises(CommunicationError, match=r"'epoch_end' event within 0\.5 s"):
            client.request({"kind": "epoch_end"})
        client.close()


def test_an_oversized_frame_is_refused_before_it_is_read():
    from sparkdl.comm import _auth
    from sparkdl.comm.channel import CONTEXT

    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=5, max_blob=100) as server:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            session = _auth.authenticate_connector(
                sock, SECRET, CONTEXT, 0, 1, time.monotonic() + 5
            )
            header = struct.pack(">4sII", b"SDLM", 2, 1 << 30)
            h = _auth.RecordMac(session.key_c2a).hasher()  # a header with a valid tag
            h.update(header)
            sock.sendall(header + h.digest()[: _auth.TAG_BYTES] + b"{}")
            sock.settimeout(5)
            # the server hangs up (a reset when our unread bytes are discarded)
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b""
        assert server.inbox.empty()


def test_unreachable_driver_is_one_clear_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(CommunicationError, match=f"127.0.0.1:{port}"):
        ChannelClient(f"127.0.0.1:{port}", SECRET, timeout_s=2)


# Idle connections -------------------------------------------------------------------------------


def test_idle_connections_beyond_the_handshake_slots_do_not_keep_the_worker_out():
    from sparkdl.comm._accept import MAX_PENDING_HANDSHAKES

    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=5) as server:
        host, port = server.address.rsplit(":", 1)
        idle = []
        try:
            for _ in range(MAX_PENDING_HANDSHAKES + 8):  # connect, never send a byte
                idle.append(socket.create_connection((host, int(port)), timeout=5))
            client = ChannelClient(server.address, SECRET, timeout_s=5)
            thread = _answer(server, 2)
            client.send({"n": 1})
            assert client.request({"n": 2}, b"w" * 10) == {"echo": 2, "blob": 10}
            thread.join(5)
            client.close()
        finally:
            for sock in idle:
                sock.close()


# A man in the middle without the secret ---------------------------------------------------------


class _Relay:
    """A loopback TCP relay between one client and ``target`` that passes every chunk flowing
    in ``direction`` (``"up"``: client to server, ``"down"``: server to client) through
    ``rewrite``, which returns the bytes to forward. The first ``drop`` connections are
    closed at once, as a listener shedding a flood would."""

    def __init__(self, target: str, direction: str, rewrite, drop: int = 0) -> None:
        self._target = target.rsplit(":", 1)
        self._direction, self._rewrite, self._drop = direction, rewrite, drop
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(10)
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            client, _ = self._listener.accept()
            for _ in range(self._drop):
                client.close()
                client, _ = self._listener.accept()
            server = socket.create_connection((self._target[0], int(self._target[1])), 10)
            self._socks += [client, server]
            for src, dst, name in ((client, server, "up"), (server, client, "down")):
                threading.Thread(target=self._pump, args=(src, dst, name), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, name: str) -> None:
        src.settimeout(10)
        with contextlib.suppress(OSError):
            while chunk := src.recv(1 << 16):
                dst.sendall(self._rewrite(chunk) if name == self._direction else chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in [self._listener, *self._socks]:
            sock.close()


class _Frames:
    """A relay rewrite that knows the channel's layout: it passes the handshake's first
    ``skip`` bytes through, then hands each whole event frame to ``on_frame`` and forwards the
    frames it returns, in order; ``changed`` counts the frames it did not pass on as they were.
    """

    def __init__(self, skip: int, on_frame) -> None:
        self._skip, self._on_frame, self._buf = skip, on_frame, b""
        self.changed = 0

    def __call__(self, chunk: bytes) -> bytes:
        take = min(self._skip, len(chunk))
        out, self._skip = chunk[:take], self._skip - take
        self._buf += chunk[take:]
        while len(self._buf) >= 28:  # header and its tag
            _, json_len, blob_len = struct.unpack(">4sII", self._buf[:12])
            end = 28 + json_len + blob_len + 16
            if len(self._buf) < end:
                break
            frame, self._buf = self._buf[:end], self._buf[end:]
            new = self._on_frame(frame)
            self.changed += new != [frame]
            out += b"".join(new)
        return out


def _upstream(on_frame) -> _Frames:
    from sparkdl.comm._auth import CONNECTOR_REPLY_BYTES

    return _Frames(CONNECTOR_REPLY_BYTES, on_frame)


def _downstream(on_frame) -> _Frames:
    from sparkdl.comm._auth import HANDSHAKE_BYTES_ACCEPTOR

    return _Frames(HANDSHAKE_BYTES_ACCEPTOR, on_frame)


def test_a_learning_rate_rewritten_on_the_wire_fails_the_mac_and_never_reaches_the_worker():
    rewrite = _downstream(
        lambda frame: [frame.replace(b'"learning_rate": 0.001', b'"learning_rate": 1e+06')]
    )
    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=5) as server:
        relay = _Relay(server.address, "down", rewrite)
        try:
            client = ChannelClient(relay.address, SECRET, timeout_s=5)

            def answer() -> None:
                server.inbox.get(timeout=10).reply({"stop": False, "learning_rate": 0.001})

            thread = threading.Thread(target=answer, daemon=True)
            thread.start()
            with pytest.raises(CommunicationError, match="failed its MAC") as caught:
                client.request({"kind": "epoch_end", "epoch": 0})
            thread.join(5)
            assert "1e+06" not in str(caught.value)
            assert rewrite.changed == 1  # the relay really rewrote the driver's answer
            client.close()
        finally:
            relay.close()


def _tampered_upstream(rewrite: _Frames, caplog, *messages: dict) -> ChannelServer:
    """Send ``messages`` one-way through a relay that applies ``rewrite`` upstream; the driver
    hangs up on the first bad frame, so a final request fails."""
    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=5) as server:
        relay = _Relay(server.address, "up", rewrite)
        try:
            client = ChannelClient(relay.address, SECRET, timeout_s=5)
            with caplog.at_level("WARNING", logger="sparkdl.comm"):
                for message in messages:
                    client.send(message)
                with pytest.raises(CommunicationError):
                    client.request({"kind": "last"})
            client.close()
        finally:
            relay.close()
    return server


def test_a_loss_rewritten_on_the_wire_fails_the_mac_and_never_reaches_the_callbacks(caplog):
    rewrite = _upstream(lambda frame: [frame.replace(b'"loss": 0.123456', b'"loss": 9.123456')])
    message = {"kind": "epoch_end", "logs": {"loss": 0.123456}}
    server = _tampered_upstream(rewrite, caplog, message)
    assert rewrite.changed == 1
    assert server.inbox.empty()
    assert "failed its MAC" in caplog.text


def test_a_replayed_frame_fails_the_mac_and_is_delivered_once(caplog):
    replay = _upstream(lambda frame: [frame, frame] if b'"n": 1' in frame else [frame])
    server = _tampered_upstream(replay, caplog, {"kind": "batch", "n": 1})
    assert replay.changed == 1
    assert server.inbox.get(timeout=5).data["n"] == 1
    assert server.inbox.empty()
    assert "failed its MAC" in caplog.text


def test_reordered_frames_fail_the_mac_and_neither_is_delivered(caplog):
    held: list[bytes] = []

    def swap(frame: bytes) -> list[bytes]:  # hold the frame with n=1 back until n=2's
        if b'"n": 1' in frame:
            held.append(frame)
            return []
        return [frame, *held] if b'"n": 2' in frame else [frame]

    reorder = _upstream(swap)
    server = _tampered_upstream(reorder, caplog, {"n": 1}, {"n": 2})
    assert reorder.changed == 2
    assert server.inbox.empty()
    assert "failed its MAC" in caplog.text


def test_a_connection_closed_during_the_handshake_is_retried():
    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=5) as server:
        relay = _Relay(server.address, "up", lambda chunk: chunk, drop=2)
        try:
            client = ChannelClient(relay.address, SECRET, timeout_s=5)
            thread = _answer(server, 1)
            assert client.request({"n": 7}) == {"echo": 7, "blob": 0}
            thread.join(5)
            client.close()
        finally:
            relay.close()


def test_gathers_answer_every_rank_by_rank_and_keep_attempts_and_rounds_apart():
    """Three ranks of attempt 7 and three of attempt 9 gather two rounds each at once: each
    rank gets its own attempt's and round's messages in rank order, and the driver's inbox
    (its callbacks) sees none of it."""
    world = 3
    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=10) as server:
        got: dict[tuple[int, int], list[list[str]]] = {}

        def rank_body(attempt: int, rank: int) -> None:
            client = ChannelClient(server.address, SECRET, timeout_s=10)
            try:
                got[attempt, rank] = [
                    client.gather(attempt, round_, rank, world, f"a{attempt}r{round_}k{rank}")
                    for round_ in range(2)]
            finally:
                client.close()

        threads = [threading.Thread(target=rank_body, args=(attempt, rank), daemon=True)
                   for attempt in (7, 9) for rank in reversed(range(world))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(20)
        for attempt in (7, 9):
            for rank in range(world):
                assert got[attempt, rank] == [
                    [f"a{attempt}r{round_}k{r}" for r in range(world)] for round_ in range(2)]
        assert server.inbox.empty()


def test_a_gather_whose_ranks_do_not_all_come_fails_within_the_timeout():
    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=5) as server:
        client = ChannelClient(server.address, SECRET, timeout_s=0.5)
        with pytest.raises(CommunicationError, match=r"'gather' event within 0\.5 s"):
            client.gather(1, 0, 0, 2, "alone")
        client.close()

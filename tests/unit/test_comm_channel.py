"""The driver's event channel: authenticated, request/reply, bounded, refuses bad frames."""

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
        started = time.monotonic()
        with pytest.raises(CommunicationError, match="did not answer the 'epoch_end' event"):
            client.request({"kind": "epoch_end"})
        assert time.monotonic() - started < 3
        client.close()


def test_an_oversized_frame_is_refused_before_it_is_read():
    from sparkdl.comm import _auth
    from sparkdl.comm.channel import CONTEXT

    with ChannelServer(SECRET, bind_host="127.0.0.1", timeout_s=5, max_blob=100) as server:
        host, port = server.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            _auth.authenticate_connector(sock, SECRET, CONTEXT, 0, 1, time.monotonic() + 5)
            sock.sendall(struct.pack(">4sII", b"SDLE", 2, 1 << 30) + b"{}")
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

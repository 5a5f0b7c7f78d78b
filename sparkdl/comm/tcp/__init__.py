"""Direct TCP ring transport: bandwidth-optimal ring allreduce, ring allgather and pipelined
broadcast between workers, authenticated with the per-job secret.

Each rank holds two sockets: one to the next rank (it only sends on it after the handshake)
and one from the previous rank (it only receives). One thread drives both non-blocking sockets
with ``poll``, so sending and receiving proceed concurrently and large buffers never deadlock.
Every frame carries a 16-byte header (magic, op, step, sequence number, length), so ranks that
call collectives in a different order fail with :class:`CommunicationError` instead of mixing
data.

Between ranks on the same host (see :mod:`sparkdl.comm._shm`) large payloads travel through a
shared-memory ring of slots instead of the socket: the frame header still goes over TCP with
the ``_SHM_FLAG`` bit set in its op, followed by one small notice per filled slot; the receiver
consumes each slot in place (adding it straight into the output during reduce-scatter) and
returns a one-byte credit on the same connection. Every wait is therefore still a wait on a
socket, and a dead peer is still seen as a closed connection. Payload bytes moved through
shared memory count in :class:`TrafficCounters` as if they had been sent on the wire (plus the
notices and credits that really are), so traffic metrics are comparable with and without it.

Bounds: every collective as a whole must finish within ``timeout_s`` (a peer trickling bytes
cannot keep it alive); a payload whose length the collective does not imply (allgather,
broadcast) is received into a buffer that grows with the bytes that arrive, never allocated
from the declared length; any failure, ``MemoryError`` included, raises
:class:`CommunicationError`, marks the communicator broken and closes its sockets.

Integrity (``wire_integrity="mac"``): each frame header, and each record of up to
``MAC_RECORD_BYTES`` of its payload, is followed by a 16-byte tag (HMAC-SHA256, truncated)
over a record counter and the bytes; keys are per connection and direction
(:class:`_auth.Session`). Tags are verified before the bytes are used or forwarded, and shared
memory is not used. Without it, a connection is authenticated only by its handshake: bytes
altered or injected in an established stream go undetected.

The package, each module importing only those before it: :mod:`~sparkdl.comm.tcp.frames`
(the header, ops, notices, send queues with their MACs, receive steps),
:mod:`~sparkdl.comm.tcp.pump` (one collective's I/O on both connections: sending, receiving,
shared-memory slots and credits, header and MAC checks, the deadline),
:mod:`~sparkdl.comm.tcp.ring` (the communicator: its collectives as frames and steps for the
pump) and :mod:`~sparkdl.comm.tcp.formation` (listening, connecting, authenticating and
negotiating shared memory: :func:`connect_ring`).
"""

from sparkdl.comm.tcp.formation import connect_ring
from sparkdl.comm.tcp.frames import (
    HANDSHAKE_S,
    MAC_BYTES,
    MAC_RECORD_BYTES,
    MAX_MESSAGE_BYTES,
    REDUCE_BLOCK_BYTES,
    SHM_MIN_BYTES,
    SHM_SLOT_BYTES,
    SHM_SLOTS,
    SOCKET_BUFFER_BYTES,
    WIRE_INTEGRITY,
)
from sparkdl.comm.tcp.ring import TcpRingCommunicator

__all__ = [
    "HANDSHAKE_S",
    "MAC_BYTES",
    "MAC_RECORD_BYTES",
    "MAX_MESSAGE_BYTES",
    "REDUCE_BLOCK_BYTES",
    "SHM_MIN_BYTES",
    "SHM_SLOTS",
    "SHM_SLOT_BYTES",
    "SOCKET_BUFFER_BYTES",
    "WIRE_INTEGRITY",
    "TcpRingCommunicator",
    "connect_ring",
]

"""The raw-TCP side channel that carries K/V frames (engine.reference.kv_wire) from prefill to decode.

As vLLM's NIXL side channel, over plain TCP: the prefill engine listens on a second port (`FrameServer`,
advertised as `remote_kv_port`); the decode engine connects (`pull_frame`), sends one request
`!I length | {"version": 2, "request_id", "block_ids", "api_key"?}` and reads one frame, or an error header
`{"version": 2, "error": message}` with nothing after it. One pull per connection.

Copies: frames go out straight from the frame's or tensor's memory (`sendall`) and come in straight into a
preallocated tensor (`recv_into`); the CRC-32 runs on another thread, chunk by chunk, as the bytes move
(`ChunkChecksum`). Every socket operation runs under one deadline per pull (the kernel's send and receive
timeouts, `_set_deadline`).
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.reference import kv_wire
from engine.reference.kv_wire import (
    FRAME_VERSION,
    MAX_HEADER,
    U32,
    FrameBuffer,
    FrameHeader,
    KVFrame,
    KVFrameError,
    KVPullRefused,
    checksum,
    empty_kv,
    json_object,
    tensor_bytes,
)

log = logging.getLogger(__name__)


@dataclass
class StreamedFrame:
    """A frame not yet checksummed: `send()` checksums the payload chunk by chunk as it goes (`send_frame`)."""

    header: FrameHeader
    kv: torch.Tensor

    def send(self, sock: socket.socket, deadline: float) -> None:
        send_frame(sock, self.header, self.kv, deadline)


def send_sealed(sock: socket.socket, frame: FrameBuffer, deadline: float) -> None:
    """Header and payload in one `sendall` from the buffer, then the checksum: if another thread is still
    sealing the frame, the payload goes out meanwhile and only the last 4 bytes wait for it."""
    _set_deadline(sock, deadline)
    sock.sendall(frame.data[: -U32.size])
    frame.sealed.result(max(0.0, deadline - time.monotonic()))
    _set_deadline(sock, deadline)
    sock.sendall(frame.data[-U32.size :])


class ChunkChecksum:
    """The CRC-32 of a buffer, chunk by chunk in order, on its own thread as chunks are handed to it
    (`add(i)` / `add_all()`), so that checksumming overlaps the socket copy on another core; `value()` waits
    for the last chunk. Small buffers are checksummed inline (a thread is not worth it)."""

    _MIN_THREADED_CHUNKS = 4

    def __init__(self, data: memoryview):
        # kv_wire.CHUNK read here, not imported: one chunk size for sealing frames and for the side channel.
        self._chunks = [data[start : start + kv_wire.CHUNK] for start in range(0, len(data), kv_wire.CHUNK)]
        self._crc = 0
        self._ready: queue.SimpleQueue[int | None] | None = None
        if len(self._chunks) >= self._MIN_THREADED_CHUNKS:
            self._ready = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._run, name="kv-checksum", daemon=True)
            self._thread.start()

    def __len__(self) -> int:
        return len(self._chunks)

    def chunk(self, index: int) -> memoryview:
        return self._chunks[index]

    def add(self, index: int) -> None:
        """Chunks must be added in order."""
        if self._ready is None:
            self._crc = checksum(self._chunks[index], self._crc)
        else:
            self._ready.put(index)

    def add_all(self) -> None:
        for index in range(len(self._chunks)):
            self.add(index)

    def value(self) -> int:
        self.close()
        return self._crc

    def close(self) -> None:
        """Stop (after the chunks already added); idempotent."""
        if self._ready is not None:
            self._ready.put(None)
            self._thread.join()
            self._ready = None

    def _run(self) -> None:
        while (index := self._ready.get()) is not None:
            self._crc = checksum(self._chunks[index], self._crc)


def send_frame(sock: socket.socket, header: FrameHeader, kv: torch.Tensor, deadline: float) -> None:
    """Header, then the tensor's bytes straight from its memory while another thread checksums them, then the
    checksum."""
    payload = tensor_bytes(kv)
    if len(payload) != header.nbytes:
        raise ValueError(f"{len(payload)} payload bytes, header says {header.nbytes}")
    crc = ChunkChecksum(payload)
    try:
        crc.add_all()
        _set_deadline(sock, deadline)
        sock.sendall(header.encode())
        sock.sendall(payload)
        sock.sendall(U32.pack(crc.value()))
    finally:
        crc.close()


def send_error(sock: socket.socket, message: str, deadline: float) -> None:
    raw = json.dumps({"version": FRAME_VERSION, "error": message}).encode()
    _set_deadline(sock, max(deadline, time.monotonic() + 1.0))
    sock.sendall(U32.pack(len(raw)) + raw)


def recv_frame(sock: socket.socket, expect: FrameHeader, dtype: torch.dtype, deadline: float) -> KVFrame:
    """Read one frame into a fresh tensor. The header must announce exactly `expect` (request id, block
    indices, dtype, shape, size) before a byte of payload is taken; the checksum is verified chunk by chunk."""
    length = U32.unpack(_recv_exact(sock, U32.size, deadline))[0]
    if length > MAX_HEADER:
        raise KVFrameError("header", f"header of {length} bytes")
    header = FrameHeader.parse(_recv_exact(sock, length, deadline))
    header.check(dtype, expect.block_shape)
    if (header.request_id, header.block_indices) != (expect.request_id, expect.block_indices):
        raise KVFrameError("indices", f"got blocks {header.block_indices[:8]} of {header.request_id}, "
                                      f"wanted {expect.block_indices[:8]} of {expect.request_id}")
    kv = empty_kv(dtype, header.tensor_shape)
    crc = ChunkChecksum(tensor_bytes(kv))  # each chunk is checksummed while the next one arrives
    try:
        for index in range(len(crc)):
            _recv_into(sock, crc.chunk(index), deadline)
            crc.add(index)
        if crc.value() != U32.unpack(_recv_exact(sock, U32.size, deadline))[0]:
            raise KVFrameError("checksum", "payload checksum (crc32) mismatch")
    finally:
        crc.close()
    return KVFrame(header.request_id, header.block_indices, kv)


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytearray:
    buffer = bytearray(n)
    _recv_into(sock, memoryview(buffer), deadline)
    return buffer


def _recv_into(sock: socket.socket, view: memoryview, deadline: float) -> None:
    """Fill `view`. The socket is blocking with a kernel timeout (`_set_deadline`), so MSG_WAITALL takes a
    whole chunk in one system call, without a poll() and a trip through Python per packet."""
    got = 0
    while got < len(view):
        _set_deadline(sock, deadline)
        try:
            n = sock.recv_into(view[got:], 0, socket.MSG_WAITALL)
        except BlockingIOError:  # SO_RCVTIMEO passed with nothing received
            raise TimeoutError("timed out") from None
        if n == 0:
            raise KVFrameError("truncated", f"connection closed after {got} of {len(view)} bytes")
        got += n


def _set_deadline(sock: socket.socket, deadline: float) -> None:
    """Blocking mode, with the kernel's send and receive timeouts set to what is left until `deadline`."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("deadline passed")
    timeval = struct.pack("ll", int(remaining), int(remaining % 1 * 1e6) or 1)
    if sock.gettimeout() is not None:
        sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


def pull_frame(host: str, port: int, request: dict, expect: FrameHeader, dtype: torch.dtype,
               timeout_s: float) -> KVFrame:
    """One pull over the side channel (blocking; run it in a worker thread). ConnectionError/OSError from
    connecting propagate (the caller may fall back to HTTP); everything after is a KVFrameError."""
    deadline = time.monotonic() + timeout_s
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            raw = json.dumps({"version": FRAME_VERSION, **request}).encode()
            _set_deadline(sock, deadline)
            sock.sendall(U32.pack(len(raw)) + raw)
            return recv_frame(sock, expect, dtype, deadline)
        except (TimeoutError, BlockingIOError) as exc:  # a deadline, or the kernel's SO_RCVTIMEO/SO_SNDTIMEO
            raise KVFrameError("timeout", f"K/V side channel {host}:{port}: {exc or 'timed out'}") from None
        except OSError as exc:
            raise KVFrameError("socket", f"K/V side channel {host}:{port}: {exc!r}") from None
    finally:
        sock.close()


Export = Callable[[dict], FrameBuffer | StreamedFrame]


class FrameServer:
    """The prefill side of the side channel: a listener thread, and a thread per connection that reads one
    request, calls `export(request)` for the frame (a sealed FrameBuffer or a StreamedFrame) and sends it.
    `export` raises `KVPullRefused` (or any exception) to answer with an error header instead."""

    def __init__(self, host: str, port: int, export: Export, timeout_s: float):
        self._export = export
        self._timeout_s = timeout_s
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server((host, port), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="kv-side-channel", daemon=True)

    def start(self) -> FrameServer:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop listening (waits for the listener thread, up to its 0.5 s poll); open pulls run to the end."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def _serve(self, sock: socket.socket) -> None:
        deadline = time.monotonic() + self._timeout_s
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            length = U32.unpack(_recv_exact(sock, U32.size, deadline))[0]
            if length > MAX_HEADER:
                raise KVPullRefused(f"request of {length} bytes")
            request = json_object(_recv_exact(sock, length, deadline))
            if request.get("version") != FRAME_VERSION:
                raise KVPullRefused(f"unsupported side-channel version {request.get('version')}")
            frame = self._export(request)
        except (KVFrameError, OSError) as exc:
            log.info("K/V side-channel request failed: %s", exc)
            self._try(send_error, sock, str(exc), deadline)
            return
        except Exception as exc:  # the export refused (not held, bad key, ...): tell the puller why
            self._try(send_error, sock, f"{type(exc).__name__}: {exc}", deadline)
            return
        if isinstance(frame, FrameBuffer):
            self._try(send_sealed, sock, frame, deadline)
        else:
            self._try(frame.send, sock, deadline)

    @staticmethod
    def _try(fn: Callable, *args) -> None:
        try:
            fn(*args)
        except (OSError, KVFrameError) as exc:  # the puller went away or timed out; it recomputes
            log.info("K/V side channel: sending to the puller failed: %r", exc)

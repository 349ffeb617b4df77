"""The K/V frame (P/D) and the raw-TCP side channel that carries it; no engine, no HTTP.

Frame, version 2 (the same bytes in an HTTP /kv/pull response or /kv/push body and on the side channel):

    !I header length | header (UTF-8 JSON, space-padded) | payload | !I CRC-32 of the payload
    header  = {"version": 2, "request_id", "block_indices": [logical indices], "dtype": "float32",
               "block_shape": [layers, 2, block_size, kv_heads, head_dim], "nbytes", "checksum": "crc32"}
    payload = the tensor [layers, 2, n_blocks, block_size, kv_heads, head_dim] in C order

The header is padded with spaces so the payload starts 64-byte aligned, and the checksum (zlib.crc32: for
corruption in transit, not against an adversary; it runs at several GB/s and releases the GIL) comes after the
payload, so a sender can send while another thread checksums, and a receiver can checksum each chunk (on
another thread) while the next one arrives. A receiver checks the length, dtype, shape (and, on the side
channel, request id and block indices) before it takes the payload, and the checksum after; any failure is a
`KVFrameError` whose `reason` is the metric label.

Copies: `encode_frame` copies the tensor into a preallocated frame once (`FrameBuffer`); `decode_frame` views a
writable buffer without copying; the side channel sends straight from the frame's or tensor's memory
(`sendall`) and receives straight into a preallocated tensor (`recv_into`). Buffers come from a pool
(`BufferPool`), so a steady stream of transfers pays no page faults.

Side channel (as vLLM's NIXL side channel, over plain TCP): the prefill engine listens on a second port
(`FrameServer`, advertised as `remote_kv_port`); the decode engine connects, sends one request
`!I length | {"version": 2, "request_id", "block_ids", "api_key"?}` and reads one frame, or an error header
`{"version": 2, "error": message}` with nothing after it. One pull per connection.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import math
import queue
import socket
import socketserver
import struct
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

log = logging.getLogger(__name__)

FRAME_VERSION = 2
FRAME_MEDIA_TYPE = "application/x-fleet-kv"
CHECKSUM = "crc32"
MAX_HEADER = 1 << 20
CHUNK = 1 << 19  # bytes checksummed and sent (or received and checksummed) per step
_ALIGN = 64  # payload offset in a frame
_U32 = struct.Struct("!I")  # header length prefix and checksum trailer


class KVFrameError(Exception):
    """A frame that cannot be trusted, or a pull that did not deliver one; `reason` is the metric label."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class KVPullRefused(KVFrameError):
    """The prefill engine answered the side-channel request with an error (nothing was exported)."""

    def __init__(self, message: str):
        super().__init__("status", message)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class BufferPool:
    """Frame buffers, reused. A fresh 47 MB buffer costs its first-touch page faults on every transfer (~3 ms
    of CPU through numpy, which asks for huge pages; ~30 ms through torch.empty); a reused one costs none.

    `take(n)` hands out an uninitialised uint8 array of n bytes viewing a pooled buffer (at most twice as
    large), or a new one; the buffer goes back to the pool when the last thing viewing it (tensor, memoryview)
    is garbage. At most `max_bytes` wait in the pool; beyond that they are freed."""

    _GRANULE = 1 << 21  # capacities are whole huge pages

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._free: list[np.ndarray] = []
        self._free_bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        base = self._reuse(nbytes)
        if base is None:
            base = np.empty(-(-max(nbytes, 1) // self._GRANULE) * self._GRANULE, dtype=np.uint8)
        view = base[:nbytes]
        weakref.finalize(view, self._give_back, base)
        return view

    def prewarm(self, nbytes: int) -> None:
        """Put one buffer of `nbytes` (at most max_bytes), its pages already faulted in, into the pool, so that
        the first large transfer does not pay for them (a process's first huge pages can cost ~100 ms)."""
        nbytes = min(nbytes, self.max_bytes) // self._GRANULE * self._GRANULE
        if nbytes > 0:
            base = np.empty(nbytes, dtype=np.uint8)
            base[:: 1 << 12] = 0  # touch every page
            self._give_back(base)

    @property
    def free_bytes(self) -> int:
        return self._free_bytes

    def _reuse(self, nbytes: int) -> np.ndarray | None:
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if nbytes <= b.nbytes <= 2 * nbytes + self._GRANULE]
            if not fits:
                return None
            base = self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
            self._free_bytes -= base.nbytes
            return base

    def _give_back(self, base: np.ndarray) -> None:
        with self._lock:
            if self._free_bytes + base.nbytes <= self.max_bytes:
                self._free.append(base)
                self._free_bytes += base.nbytes


POOL = BufferPool(max_bytes=256 << 20)


def empty_kv(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised CPU tensor for a frame's payload, from the pool."""
    nbytes = math.prod(shape) * dtype.itemsize
    return torch.from_numpy(POOL.take(nbytes)).view(dtype).reshape(shape)


def tensor_bytes(kv: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    if not kv.is_contiguous() or kv.device.type != "cpu":
        raise ValueError("need a contiguous CPU tensor")
    return memoryview(kv.reshape(-1).view(torch.uint8).numpy())


def checksum(data: memoryview, value: int = 0) -> int:
    return zlib.crc32(data, value)


@dataclass
class FrameHeader:
    request_id: str
    block_indices: list[int]
    dtype: str
    block_shape: tuple[int, ...]  # one block: (layers, 2, block_size, kv_heads, head_dim)
    nbytes: int

    @classmethod
    def for_blocks(cls, request_id: str, block_indices: list[int], dtype: torch.dtype,
                   block_shape: tuple[int, ...]) -> FrameHeader:
        nbytes = len(block_indices) * math.prod(block_shape) * dtype.itemsize
        return cls(request_id, list(block_indices), dtype_name(dtype), tuple(block_shape), nbytes)

    @property
    def tensor_shape(self) -> tuple[int, ...]:
        layers, two, *rest = self.block_shape
        return (layers, two, len(self.block_indices), *rest)

    def encode(self) -> bytes:
        """Length prefix and JSON, padded so that the payload after it starts `_ALIGN`-byte aligned."""
        raw = json.dumps({"version": FRAME_VERSION, "request_id": self.request_id,
                          "block_indices": self.block_indices, "dtype": self.dtype,
                          "block_shape": list(self.block_shape), "nbytes": self.nbytes, "checksum": CHECKSUM})
        raw += " " * (-(_U32.size + len(raw)) % _ALIGN)
        return _U32.pack(len(raw)) + raw.encode()

    @classmethod
    def parse(cls, raw: bytes | memoryview) -> FrameHeader:
        """From the JSON (without the length prefix); KVFrameError "header" if it is not a v2 frame header."""
        header = _json_object(raw)
        if "error" in header:
            raise KVPullRefused(str(header["error"]))
        try:
            if header["version"] != FRAME_VERSION or header["checksum"] != CHECKSUM:
                raise ValueError(f"version {header['version']}, checksum {header['checksum']}")
            if not isinstance(header["block_indices"], list) or not isinstance(header["block_shape"], list):
                raise ValueError("block_indices and block_shape must be lists")
            parsed = cls(header["request_id"], [int(i) for i in header["block_indices"]], header["dtype"],
                         tuple(int(d) for d in header["block_shape"]), int(header["nbytes"]))
            if not isinstance(parsed.request_id, str) or not isinstance(parsed.dtype, str):
                raise ValueError("request_id and dtype must be strings")
        except (KeyError, TypeError, ValueError) as exc:
            raise KVFrameError("header", f"bad frame header: {exc!r}") from None
        return parsed

    def check(self, dtype: torch.dtype, block_shape: tuple[int, ...]) -> None:
        """Against the receiver's own K/V dtype and per-block shape, and the payload size they imply."""
        if self.dtype != dtype_name(dtype):
            raise KVFrameError("dtype", f"K/V dtype {self.dtype} does not match {dtype_name(dtype)}")
        if self.block_shape != tuple(block_shape):
            raise KVFrameError("shape", f"block shape {list(self.block_shape)} does not match {list(block_shape)}")
        expected = len(self.block_indices) * math.prod(block_shape) * dtype.itemsize
        if self.nbytes != expected:
            raise KVFrameError("shape", f"{self.nbytes} bytes for {len(self.block_indices)} blocks")


@dataclass
class KVFrame:
    request_id: str
    block_indices: list[int]
    kv: torch.Tensor  # [layers, 2, n, bs, h, d]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def block(self, position: int) -> torch.Tensor:
        return self.kv[:, :, position : position + 1]


# --- whole frames in memory (HTTP bodies) ---------------------------------------------------------------


class FrameBuffer:
    """One frame built in one preallocated buffer: fill `payload` (a tensor viewing the frame), then `seal()`
    writes the checksum (and resolves `sealed`); `data` is the whole frame, for an HTTP body or `send()`."""

    def __init__(self, header: FrameHeader, dtype: torch.dtype):
        head = header.encode()
        self._buffer = POOL.take(len(head) + header.nbytes + _U32.size)
        self.data = memoryview(self._buffer)
        self.data[: len(head)] = head
        self._payload = self.data[len(head) : len(head) + header.nbytes]
        self.payload = torch.from_numpy(self._buffer[len(head) : len(head) + header.nbytes])
        self.payload = self.payload.view(dtype).reshape(header.tensor_shape)
        self.sealed: concurrent.futures.Future[memoryview] = concurrent.futures.Future()

    def seal(self) -> memoryview:
        crc = 0
        for start in range(0, len(self._payload), CHUNK):  # chunks: cache-sized, and the GIL is released
            crc = checksum(self._payload[start : start + CHUNK], crc)
        _U32.pack_into(self.data, len(self.data) - _U32.size, crc)
        self.sealed.set_result(self.data)
        return self.data

    @property
    def nbytes(self) -> int:
        return len(self._payload)

    def send(self, sock: socket.socket, deadline: float) -> None:
        """Header and payload in one `sendall` from the buffer, then the checksum: if another thread is still
        sealing the frame, the payload goes out meanwhile and only the last 4 bytes wait for it."""
        _set_deadline(sock, deadline)
        sock.sendall(self.data[: -_U32.size])
        self.sealed.result(max(0.0, deadline - time.monotonic()))
        _set_deadline(sock, deadline)
        sock.sendall(self.data[-_U32.size :])


@dataclass
class StreamedFrame:
    """A frame not yet checksummed: `send()` checksums the payload chunk by chunk as it goes (`send_frame`)."""

    header: FrameHeader
    kv: torch.Tensor

    def send(self, sock: socket.socket, deadline: float) -> None:
        send_frame(sock, self.header, self.kv, deadline)


def encode_frame(request_id: str, block_indices: list[int], kv: torch.Tensor) -> memoryview:
    """kv: [layers, 2, n, bs, h, d] with n == len(block_indices). The frame (bytes-like); the tensor's bytes
    are copied once, into it."""
    if kv.dim() != 6 or kv.shape[2] != len(block_indices):
        raise ValueError(f"{tuple(kv.shape)} for {len(block_indices)} block indices")
    block_shape = (kv.shape[0], kv.shape[1], *kv.shape[3:])
    frame = FrameBuffer(FrameHeader.for_blocks(request_id, block_indices, kv.dtype, block_shape), kv.dtype)
    frame.payload.copy_(kv)
    return frame.seal()


def decode_frame(data: bytes | bytearray | memoryview, dtype: torch.dtype, block_shape: tuple[int, ...]) -> KVFrame:
    """Parse and verify a frame against the receiver's K/V dtype and per-block shape; KVFrameError if bad.
    The tensor views `data` when it is writable (no copy); read-only bytes are copied once."""
    view = memoryview(data).cast("B")
    if len(view) < _U32.size:
        raise KVFrameError("truncated", f"frame of {len(view)} bytes has no header")
    (length,) = _U32.unpack_from(view)
    if length > MAX_HEADER or _U32.size + length > len(view):
        raise KVFrameError("truncated", f"header of {length} bytes does not fit a {len(view)}-byte frame")
    header = FrameHeader.parse(view[_U32.size : _U32.size + length])
    start = _U32.size + length
    if len(view) != start + header.nbytes + _U32.size:
        raise KVFrameError("truncated", f"{len(view) - start} bytes after the header, which announces "
                                        f"{header.nbytes} + a {_U32.size}-byte checksum")
    payload = view[start : start + header.nbytes]
    crc = 0
    for offset in range(0, len(payload), CHUNK):
        crc = checksum(payload[offset : offset + CHUNK], crc)
    if crc != _U32.unpack_from(view, start + header.nbytes)[0]:
        raise KVFrameError("checksum", "payload checksum (crc32) mismatch")
    header.check(dtype, block_shape)
    if payload.readonly:
        payload = memoryview(bytearray(payload))
    kv = torch.frombuffer(payload, dtype=torch.uint8) if header.nbytes else torch.empty(0, dtype=torch.uint8)
    return KVFrame(header.request_id, header.block_indices, kv.view(dtype).reshape(header.tensor_shape))


def _json_object(raw: bytes | memoryview) -> dict:
    try:
        value = json.loads(bytes(raw))
    except ValueError as exc:
        raise KVFrameError("header", f"header is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise KVFrameError("header", "header is not an object")
    return value


# --- the side channel -----------------------------------------------------------------------------------


class ChunkChecksum:
    """The CRC-32 of a buffer, chunk by chunk in order, on its own thread as chunks are handed to it
    (`add(i)` / `add_all()`), so that checksumming overlaps the socket copy on another core; `value()` waits
    for the last chunk. Small buffers are checksummed inline (a thread is not worth it)."""

    _MIN_THREADED_CHUNKS = 4

    def __init__(self, data: memoryview):
        self._chunks = [data[start : start + CHUNK] for start in range(0, len(data), CHUNK)]
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
        sock.sendall(_U32.pack(crc.value()))
    finally:
        crc.close()


def send_error(sock: socket.socket, message: str, deadline: float) -> None:
    raw = json.dumps({"version": FRAME_VERSION, "error": message}).encode()
    _set_deadline(sock, max(deadline, time.monotonic() + 1.0))
    sock.sendall(_U32.pack(len(raw)) + raw)


def recv_frame(sock: socket.socket, expect: FrameHeader, dtype: torch.dtype, deadline: float) -> KVFrame:
    """Read one frame into a fresh tensor. The header must announce exactly `expect` (request id, block
    indices, dtype, shape, size) before a byte of payload is taken; the checksum is verified chunk by chunk."""
    length = _U32.unpack(_recv_exact(sock, _U32.size, deadline))[0]
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
        if crc.value() != _U32.unpack(_recv_exact(sock, _U32.size, deadline))[0]:
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
            sock.sendall(_U32.pack(len(raw)) + raw)
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
            length = _U32.unpack(_recv_exact(sock, _U32.size, deadline))[0]
            if length > MAX_HEADER:
                raise KVPullRefused(f"request of {length} bytes")
            request = _json_object(_recv_exact(sock, length, deadline))
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
        self._try(frame.send, sock, deadline)

    @staticmethod
    def _try(fn: Callable, *args) -> None:
        try:
            fn(*args)
        except (OSError, KVFrameError) as exc:  # the puller went away or timed out; it recomputes
            log.info("K/V side channel: sending to the puller failed: %r", exc)

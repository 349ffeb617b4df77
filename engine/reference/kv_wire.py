"""The K/V frame (P/D): its bytes, building one in a pooled buffer, parsing and verifying one; no engine, no
sockets, no HTTP. The raw-TCP side channel that also carries it is engine.reference.kv_side_channel.

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
writable buffer without copying. Buffers come from a pool (`BufferPool`), so a steady stream of transfers pays
no page faults.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import struct
import threading
import weakref
import zlib
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

FRAME_VERSION = 2
FRAME_MEDIA_TYPE = "application/x-fleet-kv"
CHECKSUM = "crc32"
MAX_HEADER = 1 << 20
CHUNK = 1 << 19  # bytes checksummed and sent (or received and checksummed) per step
_ALIGN = 64  # payload offset in a frame
U32 = struct.Struct("!I")  # header length prefix and checksum trailer (and the side channel's request prefix)


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
    is garbage. At most `max_bytes` wait in the pool; beyond that they are freed.

    A buffer comes back from a weakref finalizer, which the garbage collector may run at any allocation,
    including one made while this pool holds its lock: so a returned buffer is only appended to a deque (an
    atomic operation, no lock), and moved into the pool the next time the pool is used under its lock."""

    _GRANULE = 1 << 21  # capacities are whole huge pages

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._free: list[np.ndarray] = []
        self._free_bytes = 0
        self._returned: deque[np.ndarray] = deque()  # given back, not yet in the pool (see the class docstring)
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
        with self._lock:
            self._take_returned()
            return self._free_bytes

    def _reuse(self, nbytes: int) -> np.ndarray | None:
        with self._lock:
            self._take_returned()
            fits = [i for i, b in enumerate(self._free) if nbytes <= b.nbytes <= 2 * nbytes + self._GRANULE]
            if not fits:
                return None
            base = self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
            self._free_bytes -= base.nbytes
            return base

    def _give_back(self, base: np.ndarray) -> None:
        self._returned.append(base)

    def _take_returned(self) -> None:
        """Move given-back buffers into the pool (the lock is held), freeing what does not fit."""
        while self._returned:
            base = self._returned.popleft()
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
        raw += " " * (-(U32.size + len(raw)) % _ALIGN)
        return U32.pack(len(raw)) + raw.encode()

    @classmethod
    def parse(cls, raw: bytes | memoryview) -> FrameHeader:
        """From the JSON (without the length prefix); KVFrameError "header" if it is not a v2 frame header."""
        header = json_object(raw)
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
    writes the checksum (and resolves `sealed`); `data` is the whole frame, for an HTTP body or the side
    channel (which may send the payload while another thread is still sealing)."""

    def __init__(self, header: FrameHeader, dtype: torch.dtype):
        head = header.encode()
        self._buffer = POOL.take(len(head) + header.nbytes + U32.size)
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
        U32.pack_into(self.data, len(self.data) - U32.size, crc)
        self.sealed.set_result(self.data)
        return self.data

    @property
    def nbytes(self) -> int:
        return len(self._payload)



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
    if len(view) < U32.size:
        raise KVFrameError("truncated", f"frame of {len(view)} bytes has no header")
    (length,) = U32.unpack_from(view)
    if length > MAX_HEADER or U32.size + length > len(view):
        raise KVFrameError("truncated", f"header of {length} bytes does not fit a {len(view)}-byte frame")
    header = FrameHeader.parse(view[U32.size : U32.size + length])
    start = U32.size + length
    if len(view) != start + header.nbytes + U32.size:
        raise KVFrameError("truncated", f"{len(view) - start} bytes after the header, which announces "
                                        f"{header.nbytes} + a {U32.size}-byte checksum")
    payload = view[start : start + header.nbytes]
    crc = 0
    for offset in range(0, len(payload), CHUNK):
        crc = checksum(payload[offset : offset + CHUNK], crc)
    if crc != U32.unpack_from(view, start + header.nbytes)[0]:
        raise KVFrameError("checksum", "payload checksum (crc32) mismatch")
    header.check(dtype, block_shape)
    if payload.readonly:
        payload = memoryview(bytearray(payload))
    kv = torch.frombuffer(payload, dtype=torch.uint8) if header.nbytes else torch.empty(0, dtype=torch.uint8)
    return KVFrame(header.request_id, header.block_indices, kv.view(dtype).reshape(header.tensor_shape))


def json_object(raw: bytes | memoryview) -> dict:
    """A JSON object (a frame header, or a side-channel request); KVFrameError "header" if it is not one."""
    try:
        value = json.loads(bytes(raw))
    except ValueError as exc:
        raise KVFrameError("header", f"header is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise KVFrameError("header", "header is not an object")
    return value

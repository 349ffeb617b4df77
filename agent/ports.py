"""Port blocks for engines. Each engine takes a block of consecutive ports from the agent's range
(`--port-range 8100-8999`): http, then KV events, then KV-events replay (then a NIXL side channel for a vLLM
prefill/decode engine; see `agent.launch.port_layout`). The choice is a pure function over what is reserved
and a probe that says whether a port is free; `port_is_free` is the real probe.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection


def parse_port_range(text: str) -> tuple[int, int]:
    """'8100-8999' -> (8100, 8999), inclusive. Raises ValueError naming the expected form."""
    try:
        low, high = (int(part) for part in text.split("-", 1))
    except ValueError:
        raise ValueError(f"port range {text!r} is not of the form LOW-HIGH, e.g. 8100-8999") from None
    if not 0 < low <= high <= 65535:
        raise ValueError(f"port range {text!r} must satisfy 0 < LOW <= HIGH <= 65535")
    return low, high


def pick_port_block(
    port_range: tuple[int, int],
    width: int,
    reserved: Collection[int],
    is_free: Callable[[int], bool],
    prefer: int | None = None,
) -> int | None:
    """The first port p in range with p..p+width-1 all unreserved and free, or None when the range is full.

    `prefer` (an engine's previous block) is tried first, so a restarted engine keeps its URL.
    """
    low, high = port_range
    if prefer is not None and low <= prefer <= high - width + 1 and _block_ok(prefer, width, reserved, is_free):
        return prefer
    port = low
    while port + width - 1 <= high:
        busy = next((p for p in range(port, port + width) if p in reserved or not is_free(p)), None)
        if busy is None:
            return port
        port = busy + 1  # no block that contains `busy` can work: skip past it
    return None


def _block_ok(start: int, width: int, reserved: Collection[int], is_free: Callable[[int], bool]) -> bool:
    return all(p not in reserved and is_free(p) for p in range(start, start + width))


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    """True when a listening socket could bind `port` now (with SO_REUSEADDR, as uvicorn and ZMQ bind).

    The wildcard address is the strict probe: it fails if anything listens on the port on any interface.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (for tests and the local fleet's controller and agent APIs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]

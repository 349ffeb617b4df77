"""Port blocks: three consecutive free ports per engine from the agent's range."""

from __future__ import annotations

import socket

import pytest

from agent.launch import port_layout, port_width
from agent.ports import parse_port_range, pick_port_block, port_is_free
from engine.contract import EngineAssignment


def always_free(port: int) -> bool:
    return True


def test_first_block_in_an_empty_range():
    assert pick_port_block((8100, 8999), 3, set(), always_free) == 8100


def test_reserved_ports_are_skipped():
    assert pick_port_block((8100, 8999), 3, {8100, 8101, 8102}, always_free) == 8103
    assert pick_port_block((8100, 8999), 3, {8102}, always_free) == 8103


def test_busy_ports_are_skipped():
    busy = {8101, 8105}
    assert pick_port_block((8100, 8999), 3, set(), lambda p: p not in busy) == 8102
    assert pick_port_block((8100, 8999), 3, {8102}, lambda p: p not in busy) == 8106


def test_full_range_gives_none():
    assert pick_port_block((8100, 8104), 3, {8102}, always_free) is None
    assert pick_port_block((8100, 8101), 3, set(), always_free) is None


def test_preferred_block_is_kept_when_free():
    assert pick_port_block((8100, 8999), 3, set(), always_free, prefer=8400) == 8400
    assert pick_port_block((8100, 8999), 3, {8401}, always_free, prefer=8400) == 8100
    assert pick_port_block((8100, 8999), 3, set(), always_free, prefer=8998) == 8100  # would overflow the range


def test_parse_port_range():
    assert parse_port_range("8100-8999") == (8100, 8999)
    for bad in ("8100", "a-b", "9000-8000", "0-10", "1-70000"):
        with pytest.raises(ValueError):
            parse_port_range(bad)


def test_port_is_free_sees_a_listener():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_is_free(port)
    assert port_is_free(port)


def assignment(backend: str, role: str = "mixed", dp: int = 1) -> EngineAssignment:
    spec = {"backend": backend, "weights": "w", "data_parallel_size": dp}
    return EngineAssignment(name="e-0", model="m", class_ref="c@r1", spec=spec, role=role)


def test_layout_reference_engine_takes_three_ports():
    a = assignment("reference")
    assert port_width(a) == 3
    block = port_layout(8100, a)
    assert (block.http, block.kv_events, block.replay, block.side_channel) == (8100, 8101, 8102, None)


def test_layout_vllm_leaves_room_for_dp_ranks_and_the_side_channel():
    a = assignment("vllm", role="prefill", dp=2)
    assert port_width(a) == 7
    block = port_layout(8100, a)
    # events 8101-8102 (rank offsets), replay 8103-8104, side channel 8105-8106
    assert (block.http, block.kv_events, block.replay, block.side_channel) == (8100, 8101, 8103, 8105)
    assert port_width(assignment("vllm")) == 3

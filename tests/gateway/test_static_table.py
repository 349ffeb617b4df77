"""`--engines` entries and the routing table built from what the engines say about themselves."""

from __future__ import annotations

import pytest

from fleetctl.gateway.routing_table import kv_events_endpoints, parse_routing_table
from fleetctl.gateway.static_table import (
    Discovered, build_table, due_for_discovery, parse_static_engine, parse_static_engines, spec_from_card,
)


def test_entries_parse_roles_and_kv_events() -> None:
    plain = parse_static_engine("http://127.0.0.1:8100/")
    assert (plain.name, plain.url, plain.role, plain.kv_events_endpoint) == ("127.0.0.1:8100", "http://127.0.0.1:8100", "mixed", None)
    prefill = parse_static_engine("http://10.0.0.2:8200?role=prefill&kv_events=tcp://10.0.0.2:8201")
    assert (prefill.role, prefill.kv_events_endpoint, prefill.url) == ("prefill", "tcp://10.0.0.2:8201", "http://10.0.0.2:8200")
    assert [e.name for e in parse_static_engines(["http://a:1,http://b:2", "http://c:3"])] == ["a:1", "b:2", "c:3"]


@pytest.mark.parametrize(("entry", "words"), [
    ("127.0.0.1:8100", "expected http"), ("http://h", "expected http"), ("http://h:1?role=boss", "role must be"),
    ("http://h:1?colour=red", "unknown option"),
])
def test_bad_entries_say_what_is_wrong(entry: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_static_engine(entry)


def test_an_engine_listed_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        parse_static_engines("http://a:1,http://a:1?role=decode")


def test_cards_become_class_specs() -> None:
    reference = spec_from_card({"id": "tiny", "root": "tiny", "max_model_len": 2048}, 16)
    assert (reference["backend"], reference["weights"], reference["max_model_len"], reference["block_size"]) == ("reference", "tiny", 2048, 16)
    vllm = spec_from_card({"id": "qwen", "root": "Qwen/Qwen3-0.6B", "max_model_len": 4096}, None)
    assert (vllm["backend"], vllm["weights"], vllm["block_size"]) == ("vllm", "Qwen/Qwen3-0.6B", 16)


def test_the_table_has_the_controllers_shape() -> None:
    spec = spec_from_card({"id": "tiny", "root": "tiny", "max_model_len": 2048}, 16)
    long_spec = spec_from_card({"id": "tiny", "root": "tiny", "max_model_len": 4096}, 16)
    found = [
        Discovered(parse_static_engine("http://h:1?role=prefill&kv_events=tcp://h:2"), "tiny", spec),
        Discovered(parse_static_engine("http://h:5?role=decode"), "tiny", spec),
        Discovered(parse_static_engine("http://h:9"), "tiny", long_spec),
    ]
    raw = build_table(found, {"pd_push": False})
    table = parse_routing_table(raw)
    model = table.models["tiny"]
    assert model.pd is True and set(model.traffic) == {"static@r1", "static@r2"}
    assert {e.class_ref for e in table.engines[:2]} == {"static@r1"} and table.engines[2].class_ref == "static@r2"
    assert table.flags == {"pd_push": False}
    assert [(e.engine_id, e.publisher, e.replay) for e in kv_events_endpoints(table)] == [("h:1", "tcp://h:2", "tcp://h:3")]
    assert build_table(found, {"pd_push": False})["generation"] == raw["generation"]


def test_only_new_engines_and_stale_discoveries_are_asked_again() -> None:
    engines = parse_static_engines("http://h:1,http://h:2,http://h:3")
    discovered_at = {"h:1": 100.0, "h:2": 80.0}  # h:3 never answered
    assert [e.name for e in due_for_discovery(engines, discovered_at, 105.0, 30.0)] == ["h:3"]
    assert [e.name for e in due_for_discovery(engines, discovered_at, 110.0, 30.0)] == ["h:2", "h:3"]
    assert [e.name for e in due_for_discovery(engines, discovered_at, 130.0, 30.0)] == ["h:1", "h:2", "h:3"]
    assert [e.name for e in due_for_discovery(engines, {}, 0.0, 30.0)] == ["h:1", "h:2", "h:3"]

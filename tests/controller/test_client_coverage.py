"""The typed client covers the controller API exactly: every route declares a response schema, every route
has one entry in the client's call table (and every entry a route), the sync and async clients have the
same methods, and each family of response models round-trips a real controller's replies unchanged
(SQLite and PostgreSQL): the model's JSON form equals the body the controller sent (for the change stream:
its first event's data)."""

from __future__ import annotations

from datetime import datetime, timezone

import asyncio
import functools
import http.server
import inspect
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from canary_store_helpers import add_probes, store_reference
from ctl_helpers import SPEC, Clock
from pydantic import TypeAdapter

from fleetctl.canary.golden import load_golden, shipped_golden
from fleetctl.canary.types import ConditionNoise, PromptReference, Reference
from fleetctl.client import AsyncControllerClient, ControllerCalls, ControllerClient, Endpoint
from fleetctl.controller.api.app import create_app
from fleetctl.controller.server import ServerThread
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens
from fleetctl.controller.watch_contract import WatchSnapshot
from fleetctl.replica_class import ReplicaClassSpec, correctness_digest
from fleetctl.watch_client import sse_events

REPO_ROOT = Path(__file__).resolve().parents[2]
HTTP_METHODS = {"GET", "POST", "PUT", "DELETE", "PATCH"}
NODE = "n1"
# Each round-trip test below calls every route of its OpenAPI tags.
FAMILIES = {"fleet": {"fleet", "nodes"}, "classes": {"classes", "deployments"}, "policy": {"policy", "break-glass"},
            "admin": {"admin"}, "agents": {"agents", "gateways"}, "rollouts": {"rollouts"}, "canary": {"canary"}, "drills": {"drills"},
            "canary_refs": {"canary-refs"}, "watch": {"watch"}, "pd": {"pd"}}
REGISTRATION = {"node": NODE, "url": "http://n1:9000", "labels": {"zone": "a"},
                "capacity": {"engines": 2, "kv_mib": 64}, "agent_version": "test"}


@functools.cache
def openapi_operations() -> dict[tuple[str, str], dict[str, Any]]:
    app = create_app(ControllerSettings(db_url="sqlite://", background=False))
    return {(method.upper(), path): operation
            for path, operations in app.openapi()["paths"].items()
            for method, operation in operations.items() if method.upper() in HTTP_METHODS}


def routes_tagged(tags: set[str]) -> set[tuple[str, str]]:
    return {key for key, operation in openapi_operations().items() if tags & set(operation.get("tags", []))}


def call_table() -> dict[tuple[str, str], Endpoint[Any, Any]]:
    endpoints = ControllerCalls.endpoints()
    table = {(e.method, e.path): e for e in endpoints}
    assert len(table) == len(endpoints), "two call-table entries for one route"
    return table


# --- coverage, from the schema alone ---

def test_every_route_declares_its_success_response_schema() -> None:
    missing = []
    for (method, path), operation in openapi_operations().items():
        success = operation["responses"].get("200") or operation["responses"].get("201") or {}
        content = success.get("content", {})
        json_schema = content.get("application/json", {}).get("schema")
        declared = (json_schema not in (None, {})) or "text/plain" in content or "text/event-stream" in content
        if not declared:
            missing.append(f"{method} {path}")
    assert missing == []


def test_metrics_is_declared_as_text() -> None:
    responses = openapi_operations()[("GET", "/metrics")]["responses"]
    assert list(responses["200"]["content"]) == ["text/plain"]


def test_the_call_table_covers_every_route_and_nothing_else() -> None:
    routes, calls = set(openapi_operations()), set(call_table())
    assert sorted(routes - calls) == [], "routes without a client call"
    assert sorted(calls - routes) == [], "client calls without a route"


def test_each_call_parses_the_model_its_route_declares() -> None:
    schemas = openapi_operations()
    for key, endpoint in call_table().items():
        success = schemas[key]["responses"].get("200") or schemas[key]["responses"]["201"]
        declared = success["content"].get("application/json", {}).get("schema", {})
        ref = declared.get("$ref") or declared.get("items", {}).get("$ref") or \
            declared.get("additionalProperties", {}).get("$ref")
        if ref is None:  # text
            assert endpoint.response_type is str, key
            continue
        name = ref.rsplit("/", 1)[1]
        assert name in json.dumps(TypeAdapter(endpoint.response_type).json_schema()), (key, name)


def test_the_sync_and_async_clients_have_the_same_methods() -> None:
    def public(cls: type) -> dict[str, inspect.Signature]:
        return {name: inspect.signature(getattr(cls("http://127.0.0.1:1"), name)) for name in dir(cls)
                if not name.startswith("_") and isinstance(getattr(cls, name), Endpoint)}

    sync, asynchronous = public(ControllerClient), public(AsyncControllerClient)
    assert sync == asynchronous and len(sync) == len(call_table())


def test_the_client_imports_no_controller_runtime() -> None:
    forbidden = ("sqlalchemy", "fleetctl.controller.models", "fleetctl.controller.db", "fleetctl.controller.runtime",
                 "fleetctl.controller.api", "torch")
    probe = ("import sys, fleetctl.client; "
             f"print(' '.join(m for m in sys.modules if m.startswith({forbidden!r})))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_the_token_is_in_no_repr() -> None:
    calls = call_table()
    created = calls[("POST", "/api/v1/tokens")].adapter.validate_python(
        {"name": "t", "role": "viewer", "created_at": "x", "created_by": "a", "revoked_at": None, "token": "fleet_s3cret"})
    assert created.token == "fleet_s3cret" and "fleet_s3cret" not in repr(created)
    assert "fleet_s3cret" not in repr(ControllerClient("http://127.0.0.1:1", "fleet_s3cret"))


# --- round trips against a real controller ---

def test_the_round_trip_families_span_every_route() -> None:
    assert set().union(*(routes_tagged(tags) for tags in FAMILIES.values())) == set(openapi_operations())


class Recorder(httpx.HTTPTransport):
    """The real transport, keeping each reply's body, so a test compares what the client returned with it."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.read()
        self.bodies.append(response.content)
        return response


class Checked:
    """A client per role whose every call is checked: the result's JSON form equals the reply's body."""

    def __init__(self, server: ServerThread) -> None:
        self.server, self.tokens = server, role_tokens(server.runtime.store)
        self.covered: set[tuple[str, str]] = set()

    def __call__(self, token_role: str, name: str, /, *args: Any, **kwargs: Any) -> Any:
        recorder = Recorder()
        with ControllerClient(self.server.url, self.tokens[token_role], transport=recorder) as client:
            result = getattr(client, name)(*args, **kwargs)
        endpoint: Endpoint[Any, Any] = getattr(ControllerCalls, name)
        body = recorder.bodies[-1].decode()
        if endpoint.response_type is str:
            assert result == body
        else:
            assert endpoint.adapter.dump_python(result, mode="json", by_alias=True) == json.loads(body), name
        self.covered.add((endpoint.method, endpoint.path))
        return result

    def assert_covered(self, family: str) -> None:
        assert sorted(routes_tagged(FAMILIES[family]) - self.covered) == [], f"{family} routes not round-tripped"


class EngineAnswers:
    """A stand-in for an engine on loopback that answers what adoption asks (/v1/models, /metrics,
    /v1/fleet/config) with a reference engine's empty account: this test checks the client's round trip of
    the adopt and release replies, not adoption (tests/gateway/test_engine_adoption_process.py does, on a real
    engine)."""

    def __init__(self, model: str) -> None:
        answers = {"/v1/models": json.dumps({"object": "list", "data": [{"id": model, "object": "model"}]}),
                   "/metrics": "", "/v1/fleet/config": json.dumps({"source": "reference", "settings": {}})}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                body = answers.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write((body or "").encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "EngineAnswers":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def checked(db_url: str, tmp_path: Path) -> Iterator[Checked]:
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path, port=0, background=False, heartbeat_interval_s=5.0)
    with ServerThread(settings) as server:
        yield Checked(server)


def run_one_ready_engine(call: Checked) -> str:
    """A class, a one-replica deployment, a node whose agent reports the placed engine ready. Its name."""
    call("operator", "apply_class", "chat", SPEC, reason="test")
    call("operator", "set_deployment", "chat", "chat@r1", 1, placement={"zone": "a"})
    call("agent", "register_agent", REGISTRATION)
    call.server.runtime.step()
    beat = call("agent", "heartbeat", {"node": NODE, "generation": 0, "engines": [], "cut_off_s": None})
    (assigned,) = beat.assignment
    observed = {"name": assigned.name, "model": assigned.model, "class_ref": assigned.class_ref, "role": assigned.role,
                "state": "ready", "url": "http://n1:8100", "port": 8100, "pid": 42, "restarts": 0,
                "metrics": {"num_requests_running": 1.0},
                "reported": {"source": "reference", "version": "0.1.0", "settings": {"kv_cache_dtype": "bfloat16"}}}
    call("agent", "heartbeat", {"node": NODE, "generation": beat.generation, "engines": [observed], "cut_off_s": 1.5})
    return assigned.name


def test_fleet_reads_and_drains_round_trip(checked: Checked) -> None:
    engine = run_one_ready_engine(checked)
    assert checked("viewer", "health").ok is True
    status = checked("viewer", "status")
    assert [n.name for n in status.nodes] == [NODE] and status.deployments[0].ready == 1
    assert checked("viewer", "list_nodes")[0].capacity.kv_mib == 64
    detail = checked("viewer", "get_node", NODE)
    assert detail.cut_off_s == 1.5 and [e.name for e in detail.engine_list] == [engine]
    assert checked("viewer", "list_engines", node=NODE)[0].metrics["num_requests_running"] == 1.0
    assert checked("viewer", "get_engine", engine).state == "ready"
    (drifted,) = checked("viewer", "live_drift", model="smollm2-135m")
    assert (drifted.name, drifted.drifted, drifted.drift[0].field) == (engine, True, "kv_cache_dtype")
    assert status.drifted == 1 and status.engines[0].drift[0].actual == "bfloat16"
    assert checked("operator", "drain_engine", engine, reason="test").result == "changed"
    # drained, it takes no traffic, so even the revision's last engine may be cordoned
    assert checked("operator", "cordon_engine", engine, reason="test").cordoned is True
    assert checked("operator", "uncordon_engine", engine).generation is not None
    assert checked("operator", "cordon_node", NODE).cordoned is True
    assert checked("operator", "drain_node", NODE).draining is True
    assert checked("operator", "uncordon_node", NODE).result == "changed"
    flush = checked("operator", "flush_node_kv", NODE, class_name="chat", tier="disk", reason="test").flush
    assert (flush.id, flush.class_name, flush.tier) == (1, "chat", "disk")
    assert checked("viewer", "get_node", NODE).kv_flush.id == 1
    assert "fleet_" in checked("viewer", "metrics")
    assert checked("viewer", "routing").engines[0].name == engine
    with EngineAnswers(SPEC["model"]) as outside:  # an engine fleetctl did not launch
        adopted = checked("operator", "adopt_engine", outside.url, SPEC["model"], "chat@r1", reason="test")
        assert (adopted.adopted, adopted.node, adopted.state) == (True, "adopted", "ready")
        assert checked("operator", "release_engine", adopted.name).state == "draining"
    checked.assert_covered("fleet")


def test_classes_and_deployments_round_trip(checked: Checked) -> None:
    assert checked("operator", "apply_class", "chat", SPEC).result == "created"
    assert checked("operator", "apply_class", "chat", SPEC).result == "unchanged"
    checked("operator", "apply_class", "chat", {**SPEC, "max_model_len": 4096})
    assert checked("viewer", "get_class", "chat").ref == "chat@r2"
    assert checked("viewer", "list_classes")[0].revisions == 2
    history = checked("viewer", "class_history", "chat")
    assert [c.field for c in history[1].changes] == ["max_model_len"]
    created = checked("operator", "set_deployment", "chat", "chat@r1", 2, role="prefill", placement={"zone": "a"})
    assert (created.result, created.version) == ("created", 1)
    assert checked("viewer", "get_deployment", "chat").placement == {"zone": "a"}
    assert [d.name for d in checked("viewer", "list_deployments")] == ["chat"]
    assert checked("operator", "delete_deployment", "chat").result == "deleted"
    checked.assert_covered("classes")


def test_traffic_and_flags_round_trip(checked: Checked) -> None:
    run_one_ready_engine(checked)
    result = checked("operator", "set_traffic", "smollm2-135m", {"chat@r1": 1.0}, reason="test")
    assert (result.result, result.version, result.correctness_differences) == ("changed", 1, [])
    assert checked("viewer", "list_traffic")["smollm2-135m"].weights == {"chat@r1": 1.0}
    view = checked("viewer", "get_traffic", "smollm2-135m")
    assert view.source == "policy" and view.revisions[0].ready_engines == 1
    assert checked("operator", "set_flag", "pd_push", False, reason="test").value is False
    assert checked("operator", "set_flag", "shed_fraction:smollm2-135m", 0.5, reason="test", ttl_s=60).value == 0.5
    flags = checked("viewer", "list_flags")
    assert flags["pd_push"].value is False and flags["shed_fraction:smollm2-135m"].expires_at is not None
    assert checked("viewer", "get_flag", "prefix_routing").value is True  # its default: never set
    assert checked("operator", "unset_flag", "pd_push", reason="test").result == "changed"
    assert checked("admin", "freeze", reason="test", ttl_s=60).value is True
    assert checked("admin", "unfreeze", reason="test").result == "changed"
    assert checked("admin", "pin_model", "smollm2-135m", "chat@r1", reason="test").value == "chat@r1"
    assert checked("admin", "unpin_model", "smollm2-135m", reason="test").result == "changed"
    assert checked("admin", "shed_model", "smollm2-135m", 0.25, reason="test").value == 0.25
    assert checked("admin", "kill_switch", "prefix_routing", reason="test").value is False
    drain = {"seq": 1, "at": 1_767_225_600.0, "action": "drain", "target": "chat-0", "reason": "outage"}
    reply = checked("agent", "upload_direct_actions", {"kind": "agent", "source": NODE, "actions": [drain], "open": [1]})
    assert reply.acknowledged == 1 and reply.resolved == {}
    (held,) = checked("viewer", "divergence")
    assert (held.source, held.action, held.desired) == (NODE, "drain", "run")
    assert checked("viewer", "divergence", all=True)[0].id == held.id
    assert checked("admin", "reconcile", revert=[held.id], reason="test").reverted == [held.id]
    checked.assert_covered("policy")


def test_tokens_and_audit_round_trip(checked: Checked) -> None:
    created = checked("admin", "create_token", "ops-1", "operator", reason="test")
    assert created.token.startswith("fleet_") and created.revoked_at is None
    assert "ops-1" in [t.name for t in checked("admin", "list_tokens")]
    revoked = checked("admin", "revoke_token", "ops-1")
    assert (revoked.result, revoked.overridden) == ("revoked", [])
    events = checked("viewer", "list_audit", actor=None, limit=10)
    assert [e.action for e in events][-2:] == ["token.create", "token.revoke"] and events[-1].reason is None
    step = {"runbook": "node-maintenance", "run_id": "r1", "event": "step", "outcome": "failed", "phase": "steps",
            "step": 3, "kind": "check", "text": "fleetctl node show n1 -o json", "detail": "got false"}
    assert checked("operator", "record_runbook", step).target == "node-maintenance steps.3"
    checked.assert_covered("admin")


def test_agents_gateways_and_routing_round_trip(checked: Checked) -> None:
    engine = run_one_ready_engine(checked)
    table = checked("viewer", "routing")
    assert [e.name for e in table.engines] == [engine] and table.models["smollm2-135m"].traffic == {"chat@r1": 1.0}
    report = {"name": "gw-1", "url": "http://gw:8000", "generation": table.generation, "table_age_s": 0.5}
    assert checked("viewer", "report_gateway", report).stale is False
    assert [g.generation for g in checked("viewer", "list_gateways")] == [table.generation]
    checked.assert_covered("agents")


def test_rollouts_round_trip(checked: Checked) -> None:
    run_one_ready_engine(checked)
    checked("operator", "apply_class", "chat", {**SPEC, "max_num_seqs": 128})
    checked("operator", "set_traffic", "smollm2-135m", {"chat@r1": 1.0})
    spec = {"model": "smollm2-135m", "to": "chat@r2", "steps": [{"scale": {}}, {"setWeight": 50}]}
    started = checked("operator", "start_rollout", spec, reason="test")
    assert (started.from_ref, started.phase, started.spec["from"]) == ("chat@r1", "progressing", "chat@r1")
    assert [r.id for r in checked("viewer", "list_rollouts", model="smollm2-135m", active=True)] == [started.id]
    assert checked("viewer", "get_rollout", started.id).steps[1].text == "setWeight 50"
    paused = checked("operator", "rollout_command", started.id, "pause", reason="test", version=started.version)
    assert (paused.phase, paused.version) == ("paused", started.version + 1)
    assert checked("operator", "rollout_command", started.id, "promote", full=True).phase == "progressing"
    assert [e.event for e in checked("viewer", "rollout_history", started.id)] == ["started", "paused", "promoted"]
    checked.assert_covered("rollouts")


def test_pd_round_trip(checked: Checked) -> None:
    run_one_ready_engine(checked)  # one mixed engine
    (model,) = checked("viewer", "pd_status")
    assert (model.model, model.ratio.mixed, model.mode) == ("smollm2-135m", 1, "off")
    assert checked("viewer", "pd_status", model="smollm2-135m")[0].engines[0].role == "mixed"
    settings = checked("operator", "pd_settings", "smollm2-135m", mode="advisory", ttft_slo_s=1.5, reason="test")
    assert (settings.mode, settings.settings["ttft_slo_s"]) == ("advisory", 1.5)
    profile = checked("operator", "set_pd_profile", "chat@r1", 800.0, 8.0, detail={"points": []}, reason="test",
                      decode_itl_s=0.04)
    assert (profile.prefill_tokens_per_s, profile.decode_slots, profile.decode_itl_s) == (800.0, 8.0, 0.04)
    assert checked("viewer", "pd_status", model="smollm2-135m")[0].profile["decode_itl_s"] == 0.04
    assert [p.class_ref for p in checked("viewer", "list_pd_profiles")] == ["chat@r1"]
    checked("operator", "set_deployment", "chat", "chat@r1", 2, placement={"zone": "a"})
    checked.server.runtime.step()  # the second engine is placed
    preview = checked("operator", "pd_rebalance", "smollm2-135m", 1, 1, mixed=0)
    assert preview.rebalance is None and len(preview.preview.flips) == 2
    started = checked("operator", "pd_rebalance", "smollm2-135m", 1, 1, mixed=0, apply=True, reason="test")
    assert started.rebalance is not None and started.rebalance.phase == "baseline"
    assert [r.id for r in checked("viewer", "list_rebalances", model="smollm2-135m")] == [started.rebalance.id]
    assert checked("viewer", "get_rebalance", started.rebalance.id).events[0].event == "created"
    assert checked("operator", "stop_rebalance", started.rebalance.id, reason="test").stop_requested.startswith("test-operator")
    checked.assert_covered("pd")


def test_canary_round_trip(checked: Checked) -> None:
    run_one_ready_engine(checked)
    clock = Clock()
    clock.now = datetime.now(timezone.utc)  # the server's runtime runs on the real clock (and prunes old probes)
    store = SimpleNamespace(runtime=checked.server.runtime, clock=clock)  # what the probe executor stores
    reference = store_reference(store, "chat@r1")  # type: ignore[arg-type]
    add_probes(store, reference, "chat@r1", 12)  # type: ignore[arg-type]
    add_probes(store, reference, "chat@r1", 3, kind="production", diverged=True)  # type: ignore[arg-type]
    checked.server.runtime.step()
    streams = checked("viewer", "canary_status", model="smollm2-135m")
    assert [(s.kind, s.class_ref, s.batch, s.verdict) for s in streams] == [
        ("production", None, "mixed", "not_measured"), ("production", "chat@r1", "mixed", "not_measured"),
        ("pinned", "chat@r1", "b1", "healthy")]
    assert streams[2].evidence is not None and streams[2].evidence.probes == 12
    shown = checked("viewer", "canary_class", "chat@r1", limit=5)
    assert shown.class_ref == "chat@r1" and len(shown.probes) == 5 and shown.probes[-1].score.diverged
    assert [e.verdict_to for e in checked("viewer", "canary_events", model="smollm2-135m", limit=10)] == ["healthy"]
    checked.assert_covered("canary")


def test_drills_round_trip(checked: Checked) -> None:
    engine = run_one_ready_engine(checked)
    checked("operator", "apply_class", "chat", {**SPEC, "max_model_len": 8192})
    checked("operator", "set_deployment", "chat-long", "chat@r2", 1, placement={"zone": "a"})
    checked.server.runtime.step()
    beat = checked("agent", "heartbeat", {"node": NODE, "generation": 0, "engines": [], "cut_off_s": None})
    ready = [{"name": a.name, "model": a.model, "class_ref": a.class_ref, "role": a.role, "state": "ready",
              "url": f"http://n1:{8100 + i}", "port": 8100 + i, "pid": 42 + i, "restarts": 0, "metrics": {}}
             for i, a in enumerate(beat.assignment)]
    checked("agent", "heartbeat", {"node": NODE, "generation": beat.generation, "engines": ready, "cut_off_s": None})
    started = checked("operator", "start_misroute_drill", "smollm2-135m", "chat@r2", 0.15, 600, reason="test")
    assert (started.kind, started.to_ref, started.active) == ("misroute", "chat@r2", True)
    assert checked("viewer", "get_traffic", "smollm2-135m").drill.id == started.id
    assert checked("operator", "stop_drill", started.id, reason="test").result == "changed"
    planted = checked("operator", "start_plant_drill", engine, "rope_perturb", 60)
    assert (planted.engine, planted.fault) == (engine, "rope_perturb")
    assert [d.id for d in checked("viewer", "list_drills")] == [planted.id, started.id]
    stopped = checked("operator", "stop_all_drills")
    assert [d.id for d in stopped.stopped] == [planted.id]
    checked.assert_covered("drills")


def test_canary_golden_sets_and_references_round_trip(checked: Checked) -> None:
    golden = load_golden(shipped_golden("smollm2"))
    assert checked("operator", "put_golden_set", golden.model_dump(mode="json"), reason="test").result == "changed"
    assert [g.prompts for g in checked("viewer", "list_golden_sets")] == [len(golden.prompts)]
    checked("operator", "apply_class", "chat", SPEC)
    prompts = {p.id: PromptReference(prompt_id=p.id, tokens=[1], text="x", top_logprobs=[[(1, -0.5)]],
                                     expected_pass=None, noise={1: ConditionNoise(runs=3, diverged=0)})
               for p in golden.prompts}
    reference = Reference(golden_set=golden.name, golden_version=golden.version, model=golden.model, class_ref="chat@r1",
                          correctness_digest=correctness_digest(ReplicaClassSpec.model_validate(SPEC)),
                          recorded_at="2026-01-01T00:00:00Z", recorded_by="test", prompts=prompts)
    stored = checked("operator", "put_reference", reference.model_dump(mode="json"))
    assert (stored.class_ref, stored.noise[1].runs) == ("chat@r1", 3 * len(golden.prompts))
    assert [r.id for r in checked("viewer", "list_references", model=golden.model)] == [stored.id]
    checked.assert_covered("canary_refs")


def test_watch_and_whoami_round_trip(checked: Checked) -> None:
    engine = run_one_ready_engine(checked)
    me = checked("viewer", "whoami")
    assert me.role == "viewer" and me.name.startswith("test-viewer")
    with ControllerClient(checked.server.url, checked.tokens["viewer"]) as client:
        lines = client.watch_stream()
        first = next(sse_events(lines))
        lines.close()
    snapshot = WatchSnapshot.model_validate_json(first.data)
    assert (first.event, first.id) == ("snapshot", snapshot.token)
    assert snapshot.model_dump(mode="json", by_alias=True) == json.loads(first.data)
    assert [value["name"] for value in snapshot.resources["engine"].values()] == [engine]
    checked.covered.add(("GET", "/api/v1/watch"))
    checked.assert_covered("watch")


async def test_the_async_client_returns_the_same_models(checked: Checked) -> None:
    run_one_ready_engine(checked)
    with ControllerClient(checked.server.url, checked.tokens["viewer"]) as sync:
        expected = (sync.status(), sync.list_engines(node=NODE), sync.list_flags())
    async with AsyncControllerClient(checked.server.url, checked.tokens["viewer"]) as client:
        got = await asyncio.gather(client.status(), client.list_engines(node=NODE), client.list_flags())
    assert got[1:] == list(expected[1:])
    assert got[0].model_dump(exclude={"controller", "nodes"}) == expected[0].model_dump(exclude={"controller", "nodes"})

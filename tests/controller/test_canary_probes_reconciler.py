"""The canary probe reconciler on SQLite and PostgreSQL, driven by `runtime.step()` under an injected clock:
a simulated agent reports engines ready, a gateway reports its URL, a golden set and a reference are stored.
The network path (gateway and engines, which these store tests do not run) is stood in for by
`NetworkStandIn`, which answers each probe from the stored reference; the probe client itself is tested
against a real gateway in its own tests.

Checked here: every stream of a live revision (a zero-weight one too) gets its probe, scored and stored;
production probes are attributed to the class that served them; the flag turns probes off; a fleet with no
measured capacity is probed at the floor rate, a busy one at the configured intervals; the share metric;
failed and unscorable probes stored as errors; in-flight probes not planned twice; stopping cancels them;
old probes pruned."""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from ctl_helpers import Api, Clock, beat, deploy
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from rollout_helpers import MODEL, R1, R2, Agent, served_by_r1
from sqlalchemy import select

from fleetctl.canary.schedule import budget_state
from fleetctl.canary.types import (
    ConditionNoise, GoldenPrompt, GoldenSet, ProbeOutput, PromptReference, Reference, Sampling, StreamKey,
)
from fleetctl.controller.api.app import create_app
from fleetctl.controller.canary_probes import CANARY_PROBES, PROBES_FLAG, CanaryProbeReconciler, prune_probes
from fleetctl.controller.canary_refs import class_correctness_digest
from fleetctl.controller.models import CanaryProbe, CanaryReference, GoldenSetRow
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens

GOLDEN = GoldenSet(name="canary-test", version=1, model=MODEL, prompts=[
    GoldenPrompt(id="sum", prompt="2+2=", sampling=Sampling(max_tokens=4)),
    GoldenPrompt(id="hello", messages=[{"role": "user", "content": "Say hello"}], sampling=Sampling(max_tokens=4)),
])
TOKENS = {"sum": [11, 12, 13], "hello": [21, 22, 23]}
CONDITIONS = (1, 4, 8, 16)
SETTLE_S = 10.0


class NetworkStandIn:
    """Stands in for the network path (gateway + engines): answers a probe with the reference's tokens,
    served by the pinned revision (production: `serves_production`), at the batch the probe's rows make (the
    sends to one pin and engine in flight together, plus any fillers), as the reference engine reports it.
    `wrong` revisions answer with other tokens; `fail` makes every send raise; `hold` makes sends wait until
    released (in flight)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.together: Tally[tuple[str | None, str | None]] = Tally()  # sends in flight per (pin, engine)
        self.serves_production = R1
        self.wrong: set[str] = set()
        self.fail: str | None = None
        self.hold: asyncio.Event | None = None
        self.no_served_by = False
        self.batch_wrong: set[str] = set()  # revisions whose last token flips at batch >= 4 (logprobs unchanged)

    async def __call__(self, client: Any, gateway_url: str, model: str, prompt: GoldenPrompt, *, kind: str,
                       pin: str | None = None, engine: str | None = None, fillers: int = 0, headers: Any = None,
                       timeout_s: float = 60.0) -> ProbeOutput:
        self.calls.append({"gateway": gateway_url, "model": model, "prompt": prompt.id, "kind": kind, "pin": pin,
                           "engine": engine, "fillers": fillers, "headers": dict(headers or {})})
        batch_key = (pin, engine)
        self.together[batch_key] += 1
        try:
            # a batch's rows are sent in one turn of the loop: let the others of the batch arrive, count them,
            # and let them count before this one leaves
            await asyncio.sleep(0)
            batch_size = self.together[batch_key] + fillers
            await asyncio.sleep(0)
        finally:
            self.together[batch_key] -= 1
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise RuntimeError(self.fail)
        served = pin or self.serves_production
        tokens = [t + 100 for t in TOKENS[prompt.id]] if served in self.wrong else TOKENS[prompt.id]
        tops = [[(t, 0.0)] for t in tokens]
        if served in self.batch_wrong and batch_size >= 4:
            tokens = [*tokens[:-1], tokens[-1] + 1]  # a near-tie picked wrong: the raw distributions are the same
        return ProbeOutput(prompt_id=prompt.id, tokens=tokens, text="x", top_logprobs=tops,
                           batch_size=batch_size, fillers=fillers, class_ref=None if self.no_served_by else served,
                           engine=engine or "chat-0", prompt_tokens=7, completion_tokens=len(tokens))


def store_reference(api: Api, class_ref: str = R1) -> int:
    now = api.clock()
    with api.runtime.store.session() as session:
        if session.get(GoldenSetRow, (GOLDEN.name, GOLDEN.version)) is None:
            session.add(GoldenSetRow(name=GOLDEN.name, version=GOLDEN.version, model=MODEL, digest="d" * 64,
                                     body=GOLDEN.model_dump(mode="json"), created_at=now, created_by="test"))
        digest = class_correctness_digest(session, class_ref)
        assert digest is not None
        prompts = {pid: PromptReference(prompt_id=pid, tokens=tokens, text="x", top_logprobs=[[(t, 0.0)] for t in tokens],
                                        noise={c: ConditionNoise(runs=3, diverged=0) for c in CONDITIONS})
                   for pid, tokens in TOKENS.items()}
        reference = Reference(golden_set=GOLDEN.name, golden_version=GOLDEN.version, model=MODEL, class_ref=class_ref,
                              correctness_digest=digest, recorded_at=now, recorded_by="test", prompts=prompts)
        row = CanaryReference(model=MODEL, golden_set=GOLDEN.name, golden_version=GOLDEN.version, class_ref=class_ref,
                              correctness_digest=digest, body=reference.model_dump(mode="json"), recorded_at=now,
                              recorded_by="test")
        session.add(row)
        session.flush()
        return row.id


def report_gateway(api: Api, url: str = "http://gw-1.test:8000") -> None:
    body = {"name": "gw-1", "url": url, "generation": 0, "table_age_s": 0.0, "refresh_interval_s": 3600.0}
    assert api.call("POST", "/api/v1/gateways/report", role="viewer", json=body).status_code == 200


def canary(api: Api) -> CanaryProbeReconciler:
    found = [r for r in api.runtime.runner.reconcilers if r.name == CANARY_PROBES]
    assert len(found) == 1  # registered in default_reconcilers
    return found[0]  # type: ignore[return-value]


@pytest.fixture
def fleet(settings: ControllerSettings) -> Iterator[tuple[Api, NetworkStandIn]]:
    clock = Clock()
    runtime = ControllerRuntime(settings.model_copy(update={"canary_concurrency": 16,
                                                            "canary_probe_api_key": "sk-probe-test"}), clock=clock)
    stand_in = NetworkStandIn()
    with TestClient(create_app(runtime=runtime)) as http:
        api = Api(http, runtime, role_tokens(runtime.store), clock)
        canary(api).executor.send = stand_in
        yield api, stand_in


def elapse(api: Api, agent: Agent, seconds: float) -> None:
    """Time passes; the agent keeps beating (its node stays up, its engines ready)."""
    api.clock.advance(seconds)
    agent.settle()


def probe_round(api: Api, limit: int = 8) -> list[dict[str, Any]]:
    """Reconcile and wait for what it sent to be stored, until a reconcile sends nothing more at this
    instant (a pinned probe has its engine to itself, so a class on one engine takes one reconcile per pinned
    stream that is due); every stored probe, oldest first."""
    for _ in range(limit):
        sent = len(canary(api).executor.send.calls) if isinstance(canary(api).executor.send, NetworkStandIn) else None
        api.reconcile()
        assert canary(api).executor.wait_idle(SETTLE_S)
        if sent is None or len(canary(api).executor.send.calls) == sent:
            break
    return probes(api)


def probes(api: Api) -> list[dict[str, Any]]:
    with api.runtime.store.session() as session:
        rows = session.execute(select(CanaryProbe).order_by(CanaryProbe.id)).scalars()
        return [{c: getattr(r, c) for c in ("id", "at", "kind", "class_ref", "engine", "condition", "batch_size",
                                            "prompt_id", "reference_id", "score", "prompt_tokens", "error")}
                for r in rows]


def streams(rows: list[dict[str, Any]]) -> set[tuple[str, str | None, int]]:
    return {(r["kind"], r["class_ref"], r["condition"]) for r in rows}


def sent(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """(kind, condition) of each probe the rows came from: a batch probe's rows share their stream and time."""
    batches = {(r["kind"], r["class_ref"], r["condition"], r["at"]) for r in rows if r["kind"] == "pinned"}
    return sorted([(r["kind"], r["condition"]) for r in rows if r["kind"] == "production"]
                  + [(kind, condition) for kind, _ref, condition, _at in batches])


def metric_samples(api: Api) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = api.call("GET", "/metrics", role=None).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_stream_of_a_live_revision_is_probed_scored_and_stored(fleet: tuple[Api, NetworkStandIn]) -> None:
    api, stand_in = fleet
    agent = served_by_r1(api)
    reference_id = store_reference(api)
    report_gateway(api)
    rows = probe_round(api)
    assert streams(rows) == {("production", R1, 1)} | {("pinned", R1, c) for c in CONDITIONS}
    assert all(r["error"] is None and r["score"]["match"] and not r["score"]["diverged"] for r in rows)
    assert {r["reference_id"] for r in rows} == {reference_id}
    assert all(r["at"] == api.clock() for r in rows)
    # a probe at batch condition c is c golden rows sent together, each stored and scored at that condition;
    # every stream starts its walk at the first prompt, and a batch walks on through the set (2 prompts here)
    per_stream = Tally((r["kind"], r["condition"]) for r in rows)
    assert per_stream == {("production", 1): 1, **{("pinned", c): c for c in CONDITIONS}}
    b4 = [r["prompt_id"] for r in rows if r["kind"] == "pinned" and r["condition"] == 4]
    assert b4 == ["sum", "hello", "sum", "hello"]
    pinned = [c for c in stand_in.calls if c["kind"] == "pinned"]
    assert len(pinned) == sum(CONDITIONS) and {(c["pin"], c["fillers"]) for c in pinned} == {(R1, 0)}
    assert {c["gateway"] for c in stand_in.calls} == {"http://gw-1.test:8000"}
    assert all(c["headers"] == {"Authorization": "Bearer sk-probe-test"} for c in stand_in.calls)
    samples = metric_samples(api)
    assert samples[("fleet_canary_probes_total", (("kind", "pinned"), ("model", MODEL), ("result", "ok")))] == 29
    assert samples[("fleet_canary_probes_total", (("kind", "production"), ("model", MODEL), ("result", "ok")))] == 1
    # every row: its 7 prompt tokens and 3 completion tokens
    assert samples[("fleet_canary_probe_tokens_total", (("kind", "production"), ("model", MODEL)))] == 10
    assert samples[("fleet_canary_probe_tokens_total", (("kind", "pinned"), ("model", MODEL)))] == 29 * 10


def test_the_next_round_takes_the_next_prompt(fleet: tuple[Api, NetworkStandIn]) -> None:
    api, _ = fleet
    agent = served_by_r1(api)
    store_reference(api)
    report_gateway(api)
    first = probe_round(api)
    elapse(api, agent, 120 * len(CONDITIONS) + 1)  # past a pinned stream's floor (no capacity measured)
    second = probe_round(api)[len(first):]
    assert streams(second) == streams(first)
    # each stream resumes its walk after the last prompt it sent: one row (production, b1) moved it by one,
    # a batch of an even number of rows round the 2 prompts back to the first
    last_sent = {(r["kind"], r["condition"]): r["prompt_id"] for r in first}
    resumed_at = {}
    for r in second:
        resumed_at.setdefault((r["kind"], r["condition"]), r["prompt_id"])
    following = {"sum": "hello", "hello": "sum"}
    assert resumed_at == {key: following[prompt] for key, prompt in last_sent.items()}
    assert resumed_at[("production", 1)] == resumed_at[("pinned", 1)] == "hello"


def test_a_zero_weight_revision_is_probed_and_production_probes_name_the_class_that_served_them(
        fleet: tuple[Api, NetworkStandIn]) -> None:
    api, stand_in = fleet
    agent = served_by_r1(api)  # the policy sends all of MODEL's traffic to R1
    deploy(api, "chat-r2", R2, 1)
    api.reconcile()
    agent.settle()
    store_reference(api)
    report_gateway(api)
    stand_in.serves_production = R2
    stand_in.wrong = {R2}
    rows = probe_round(api)
    assert {("pinned", R2, c) for c in CONDITIONS} <= streams(rows)
    production = [r for r in rows if r["kind"] == "production"]
    assert [(r["class_ref"], r["score"]["diverged"]) for r in production] == [(R2, True)]
    r2_pinned = [r for r in rows if r["kind"] == "pinned" and r["class_ref"] == R2]
    assert all(r["score"]["diverged"] and r["score"]["mode"] == "exact" for r in r2_pinned)  # same correctness digest
    assert all(not r["score"]["diverged"] for r in rows if r["class_ref"] == R1)


def test_a_misrouted_production_probe_is_held_to_the_heaviest_revisions_reference(
        fleet: tuple[Api, NetworkStandIn]) -> None:
    """R2 differs from R1 in a correctness field and has no reference of its own: pinned, it is judged with
    the tolerance against R1's reference; a production probe it served without traffic weight (a misroute)
    is held to R1's reference exactly, as the answer the model's user should have got."""
    api, stand_in = fleet
    agent = served_by_r1(api, rope_scaling=4.0)
    deploy(api, "chat-r2", R2, 1)
    api.reconcile()
    agent.settle()
    reference_id = store_reference(api)
    report_gateway(api)
    stand_in.serves_production = R2
    stand_in.wrong = {R2}
    rows = probe_round(api)
    (production,) = [r for r in rows if r["kind"] == "production"]
    assert (production["class_ref"], production["reference_id"]) == (R2, reference_id)
    assert (production["score"]["mode"], production["score"]["diverged"]) == ("exact", True)
    r2_pinned = [r for r in rows if r["kind"] == "pinned" and r["class_ref"] == R2]
    assert r2_pinned and all(r["score"]["mode"] == "tolerance" for r in r2_pinned)


def test_a_revision_held_to_tolerance_is_held_to_its_own_batch_1_answers_at_larger_batches(
        fleet: tuple[Api, NetworkStandIn]) -> None:
    """R2 differs from R1 in a correctness field, so its pinned rows pass within the golden set's tolerance;
    its answers that change at batch 4 and up (the raw distributions unchanged: an approximate top-k) are
    bad against its own answers at batch 1, asked for alone on the same engine when the store has none."""
    api, stand_in = fleet
    agent = served_by_r1(api, rope_scaling=4.0)
    deploy(api, "chat-r2", R2, 1)
    api.reconcile()
    agent.settle()
    store_reference(api)
    report_gateway(api)
    stand_in.batch_wrong = {R2}
    first = probe_round(api)
    rows = [r for r in first if r["kind"] == "pinned" and r["class_ref"] == R2]
    batched = [r for r in rows if r["condition"] > 1]
    assert batched and all(r["score"]["mode"] == "tolerance" for r in rows)
    assert all(r["score"]["batch_variant"] is True and r["score"]["diverged"] for r in batched)
    alone = [r for r in rows if r["condition"] == 1]
    assert {r["prompt_id"] for r in alone} == set(TOKENS) and not any(r["score"]["diverged"] for r in alone)
    assert all(r["score"]["batch_variant"] is None for r in alone)
    controls = [c for c in stand_in.calls if c["pin"] == R2]
    assert len(controls) == len(rows)  # every answer the class gave is a stored row, the batch-1 ones included
    stand_in.batch_wrong = set()  # fixed: its batch answers agree with its batch-1 ones again
    elapse(api, agent, 500)  # every stream due again, at the floor rate of a fleet with no measured capacity
    later = [r for r in probe_round(api)[len(first):] if r["kind"] == "pinned" and r["class_ref"] == R2]
    assert {r["score"]["batch_variant"] for r in later if r["condition"] > 1} == {False}
    assert not any(r["score"]["diverged"] for r in later)


def test_nothing_is_probed_without_a_reference_or_without_a_gateway(fleet: tuple[Api, NetworkStandIn]) -> None:
    api, stand_in = fleet
    agent = served_by_r1(api)
    report_gateway(api)
    assert probe_round(api) == []  # no reference
    elapse(api, agent, 3 * 3600 + 1)  # the gateway goes stale (3 missed refreshes of an hour)
    store_reference(api)
    assert probe_round(api) == [] and stand_in.calls == []


def test_the_flag_turns_probes_off_and_back_on(fleet: tuple[Api, NetworkStandIn]) -> None:
    api, _ = fleet
    agent = served_by_r1(api)
    store_reference(api)
    report_gateway(api)
    assert api.call("PUT", f"/api/v1/flags/{PROBES_FLAG}", role="operator", json={"value": False, "reason": "t"}).status_code == 200
    assert probe_round(api) == []
    elapse(api, agent, 200)
    assert probe_round(api) == []
    assert api.call("PUT", f"/api/v1/flags/{PROBES_FLAG}", role="operator", json={"value": True, "reason": "t"}).status_code == 200
    assert len(sent(probe_round(api))) == 5


def test_an_idle_fleet_is_probed_at_the_floor_rate(fleet: tuple[Api, NetworkStandIn]) -> None:
    api, _ = fleet
    agent = served_by_r1(api)
    store_reference(api)
    report_gateway(api)
    first = probe_round(api)
    elapse(api, agent, 61)  # past the pinned interval, but no capacity is measured: every stream at its floor
    assert len(probe_round(api)) == len(first)
    elapse(api, agent, 60)  # the production stream's floor (120 s), not yet a pinned stream's (4 x 120 s)
    second = probe_round(api)[len(first):]
    assert [r["kind"] for r in second] == ["production"]
    elapse(api, agent, 120 * len(CONDITIONS) - 121 + 1)
    third = probe_round(api)[len(first) + len(second):]
    assert sent(third) == [("pinned", c) for c in CONDITIONS] + [("production", 1)]
    assert metric_samples(api)[("fleet_canary_probe_share", ())] == 0.0  # no capacity: no share


def busy_engines(api: Api, agent: Agent, tokens: float) -> None:
    """The agent beats with its engines' served-token counters at `tokens`."""
    engines = [{**e, "metrics": {**e["metrics"], "prompt_tokens": tokens / 2, "generation_tokens": tokens / 2}}
               for e in agent.engines]
    beat(api, agent.node, agent.generation, engines)


def test_a_busy_fleet_is_probed_at_the_configured_intervals_and_the_share_is_exported(
        fleet: tuple[Api, NetworkStandIn]) -> None:
    api, _ = fleet
    agent = served_by_r1(api)
    elapse(api, agent, 6)  # engines' metrics are rewritten at most every 5 s (the heartbeat buffer)
    busy_engines(api, agent, 1e6)
    api.reconcile()  # the first reading
    elapse(api, agent, 10)
    busy_engines(api, agent, 3e6)  # 200,000 tokens/s: the budget allows 4,000 probe tokens/s
    store_reference(api)
    report_gateway(api)
    first = probe_round(api)
    assert len(sent(first)) == 5
    elapse(api, agent, 6)  # the production stream is due again at its 5 s interval
    assert [r["kind"] for r in probe_round(api)[len(first):]] == ["production"]
    elapse(api, agent, 55)
    later = probe_round(api)[len(first) + 1:]
    assert sent(later) == [("pinned", c) for c in CONDITIONS] + [("production", 1)]
    # the round's last reconcile counts what is stored: three production probes and two pinned rounds of
    # 1 + 4 + 8 + 16 rows, each row 10 tokens
    spent = 3 * 10 + 2 * sum(CONDITIONS) * 10
    share = metric_samples(api)[("fleet_canary_probe_share", ())]
    assert share == pytest.approx(spent / 300 / 200_000)


def test_over_the_budget_at_production_share_1_the_production_stream_keeps_its_interval_and_pinned_ones_stretch(
        fleet: tuple[Api, NetworkStandIn]) -> None:
    api, _ = fleet
    agent = served_by_r1(api)
    elapse(api, agent, 6)
    busy_engines(api, agent, 0)
    api.reconcile()
    elapse(api, agent, 10)
    busy_engines(api, agent, 3000)  # 300 tokens/s: the budget allows 6 probe tokens/s
    store_reference(api)
    report_gateway(api)
    reconciler = canary(api)
    reconciler.params = replace(reconciler.params, production_share=1.0)
    reconciler.min_probes = 1  # one probe each and the streams are measured, so none is warming
    first = probe_round(api)
    assert len(sent(first)) == 5
    api.reconcile()  # folds them
    with api.runtime.store.session() as session:
        budget = budget_state(reconciler.snapshot(session, api.clock()).schedule, reconciler.params)
    assert budget.urgent == frozenset()
    assert budget.allowed == pytest.approx(6.0) and budget.demand > budget.allowed
    assert budget.factor == 1.0 and budget.pinned_factor > 1.0  # the production stream fits; the pinned ones do not
    elapse(api, agent, 4)
    assert probe_round(api)[len(first):] == []
    elapse(api, agent, 2)
    assert [r["kind"] for r in probe_round(api)[len(first):]] == ["production"]  # every 5 s, as configured


def test_a_new_revisions_streams_warm_up_at_the_urgent_interval_until_measured(
        fleet: tuple[Api, NetworkStandIn]) -> None:
    api, _ = fleet
    agent = served_by_r1(api)
    api.reconcile()
    elapse(api, agent, 10)
    busy_engines(api, agent, 3e6)  # a budget that pays for everything
    store_reference(api)
    report_gateway(api)
    reconciler = canary(api)
    sent_at = []
    for _ in range(reconciler.min_probes):  # a round every 15.5 s (the urgent interval), not 60 s, while warming
        before = len(probes(api))
        probed = sent(probe_round(api)[before:])
        assert probed.count(("production", 1)) == 1
        sent_at.append([c for kind, c in probed if kind == "pinned"])
        elapse(api, agent, 15.5)
    assert reconciler.min_probes == 10
    # A stream is measured at 10 scored rows, then back to its 60 s interval (probed again 4 rounds after its
    # last). b1 gets 1 a round (the production probes its revision served make a stream of their own):
    # warming for all 10 rounds; b4, b8 and b16 get 4, 8 and 16 rows a probe: warming for 3, 2 and 1 rounds.
    assert [1 in r for r in sent_at] == [True] * 10
    assert [4 in r for r in sent_at] == [True] * 3 + [False] * 3 + [True] + [False] * 3
    assert [8 in r for r in sent_at] == [True] * 2 + [False] * 3 + [True] + [False] * 3 + [True]
    assert [16 in r for r in sent_at] == [True] + [False] * 3 + [True] + [False] * 3 + [True] + [False]
    before = len(probes(api))
    probed = sent(probe_round(api)[before:])  # folds the last round: each pinned stream is measured, and healthy
    with api.runtime.store.session() as session:
        assert reconciler.snapshot(session, api.clock()).schedule.urgent == {}
    assert probed == [("pinned", 4), ("production", 1)]  # 4 rounds after b4's last; the others are not due
    after = len(probes(api))
    elapse(api, agent, 45)
    assert sent(probe_round(api)[after:]) == [("pinned", 1), ("pinned", 8), ("pinned", 16), ("production", 1)]


def test_a_stream_with_bad_probes_is_suspect_and_names_the_engine_that_served_them(
        fleet: tuple[Api, NetworkStandIn]) -> None:
    api, stand_in = fleet
    agent = served_by_r1(api)
    store_reference(api)
    report_gateway(api)
    stand_in.wrong = {R1}
    rows = probe_round(api)
    api.reconcile()  # folds them: every stream had a bad probe
    engines = {r["engine"] for r in rows if r["kind"] == "pinned"}
    assert len(engines) == 1 and None not in engines
    reconciler = canary(api)
    with api.runtime.store.session() as session:
        urgent = reconciler.snapshot(session, api.clock()).schedule.urgent
    assert set(urgent) == {StreamKey(MODEL, "pinned", R1, c) for c in CONDITIONS}
    assert {u.reason for u in urgent.values()} == {"suspect"} and {u.engine for u in urgent.values()} == engines


def test_failed_probes_are_stored_as_errors(fleet: tuple[Api, NetworkStandIn]) -> None:
    api, stand_in = fleet
    agent = served_by_r1(api)
    store_reference(api)
    report_gateway(api)
    stand_in.fail = "gateway answered 502 (no engine)"
    rows = probe_round(api)
    assert len(sent(rows)) == 5 and len(rows) == 1 + sum(CONDITIONS)  # each row of a batch stored, failed
    assert all(r["score"] is None and r["error"] == "RuntimeError: gateway answered 502 (no engine)" for r in rows)
    assert {r["class_ref"] for r in rows if r["kind"] == "pinned"} == {R1}
    assert [r["class_ref"] for r in rows if r["kind"] == "production"] == [None]
    samples = metric_samples(api)
    assert samples[("fleet_canary_probes_total", (("kind", "pinned"), ("model", MODEL), ("result", "error")))] == 29
    # no capacity is measured, so a probe that worked would wait for its floor (4 conditions x 120 s); these
    # failed, cost nothing, and every stream is warming: they are tried again at the urgent 15 s
    stand_in.fail = None
    elapse(api, agent, 16)
    again = probe_round(api)[len(rows):]
    assert sent(again) == [("pinned", c) for c in CONDITIONS] + [("production", 1)]
    assert all(r["error"] is None for r in again)


def test_a_production_probe_without_served_by_is_stored_unscored(fleet: tuple[Api, NetworkStandIn]) -> None:
    api, stand_in = fleet
    agent = served_by_r1(api)
    store_reference(api)
    report_gateway(api)
    stand_in.no_served_by = True
    production = [r for r in probe_round(api) if r["kind"] == "production"]
    assert len(production) == 1 and production[0]["score"] is None
    assert "x-fleet-served-by" in production[0]["error"] and production[0]["prompt_tokens"] == 7


def test_probes_in_flight_are_not_sent_twice_and_stopping_cancels_them(settings: ControllerSettings) -> None:
    clock = Clock()
    runtime = ControllerRuntime(settings.model_copy(update={"canary_concurrency": 16}), clock=clock)
    stand_in = NetworkStandIn()
    with TestClient(create_app(runtime=runtime)) as http:
        api = Api(http, runtime, role_tokens(runtime.store), clock)
        executor = canary(api).executor
        executor.send = stand_in
        stand_in.hold = asyncio.Event()  # never set: every send waits
        agent = served_by_r1(api)
        store_reference(api)
        report_gateway(api)
        api.reconcile()
        elapse(api, agent, 200)
        api.reconcile()
        # a pinned stream has one probe in flight, so it is not sent again, and its engine serves no other
        # pinned probe meanwhile (R1 has one engine: the b4, b8 and b16 streams wait); the production stream
        # has slots for several (half the concurrency), so it took a second one
        assert executor.in_flight() == {StreamKey(MODEL, "pinned", R1, 1)}
        (pinned,) = [c for c in stand_in.calls if c["kind"] == "pinned"]
        assert pinned["engine"] is not None and executor.busy_engines() == {pinned["engine"]}
        assert executor.in_flight_count() == 3
        assert not executor.wait_idle(0.2)
    # the app stopped the runtime: the executor's probes were cancelled and its thread ended
    assert executor.in_flight() == frozenset() and executor.busy_engines() == frozenset() and not executor.running
    assert len(stand_in.calls) == 3 and probes(api) == []


def test_old_probes_are_pruned_in_bounded_batches(fleet: tuple[Api, NetworkStandIn]) -> None:
    api, _ = fleet
    old = api.clock() - timedelta(days=8)
    with api.runtime.store.session() as session:
        for i in range(5):
            session.add(CanaryProbe(at=old + timedelta(seconds=i), model=MODEL, kind="pinned", class_ref=R1, condition=1,
                                    prompt_id="sum", prompt_tokens=1, completion_tokens=1))
        session.add(CanaryProbe(at=api.clock() - timedelta(days=6), model=MODEL, kind="pinned", class_ref=R1,
                                condition=1, prompt_id="sum", prompt_tokens=1, completion_tokens=1))
    with api.runtime.store.session() as session:
        assert prune_probes(session, api.clock() - timedelta(days=7), limit=2) == 2
    api.reconcile()  # the reconciler prunes the rest (older than the 7-day retention)
    remaining = probes(api)
    assert [r["at"] for r in remaining] == [api.clock() - timedelta(days=6)]


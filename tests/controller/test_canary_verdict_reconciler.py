"""The verdict reconciler on SQLite and PostgreSQL, driven by the runtime's `step()` over canary_probes rows
stored as the probe executor stores them: streams and their attribution, alerts (an event, an audit entry,
the metric, a webhook POST to a real loopback receiver), recovery, classes no longer deployed, bounded runs,
and a webhook that fails without failing the run."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from canary_store_helpers import MODEL, add_probes, store_reference
from ctl_helpers import Api, Clock, apply_class, deploy
from fastapi.testclient import TestClient

from engine.contract.prometheus import parse_samples, sum_series
from fleetctl.canary.types import StreamState
from fleetctl.controller import canary_streams, canary_verdicts
from fleetctl.controller.api.app import create_app
from fleetctl.controller.canary_streams import load_streams
from fleetctl.controller.models import CanaryEvent, CanaryStream
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens

R1, R2 = "chat@r1", "chat@r2"


def two_revisions(api: Api) -> int:
    """chat@r1 and chat@r2 deployed for MODEL; a reference recorded from chat@r1 (returned)."""
    apply_class(api)
    apply_class(api, max_num_seqs=128)
    deploy(api, "chat", R1, 1)
    deploy(api, "chat-b", R2, 1)
    return store_reference(api, R1)


def streams(api: Api) -> dict[str, StreamState]:
    with api.runtime.store.session() as session:
        return {key.label() + f" {key.kind}": state for key, state in load_streams(session)}


def events(api: Api) -> list[tuple[str, str, str | None, str, str]]:
    with api.runtime.store.session() as session:
        rows = session.query(CanaryEvent).order_by(CanaryEvent.id).all()
        return [(r.kind, r.class_ref or "*", str(r.condition), r.verdict_from, r.verdict_to) for r in rows]


def canary_audit(api: Api) -> list[dict[str, Any]]:
    return [e for e in api.call("GET", "/api/v1/audit", role="viewer").json() if e["action"].startswith("canary.")]


def quality(api: Api, ref: str) -> str | None:
    """The rollout gate's word on `ref`."""
    with api.runtime.store.session() as session:
        return canary_streams.quality(session, MODEL, [ref])[ref]


def verdict_reconciler(api: Api) -> canary_verdicts.CanaryVerdictReconciler:
    return next(r for r in api.runtime.runner.reconcilers if r.name == canary_verdicts.CANARY_VERDICTS)


def test_pinned_probes_make_pinned_streams_and_production_probes_both(api: Api) -> None:
    ref = two_revisions(api)
    add_probes(api, ref, R1, 12)  # pinned at batch 1
    add_probes(api, ref, R1, 12, condition=4)
    add_probes(api, ref, R2, 6, kind="production")
    add_probes(api, ref, R1, 6, kind="production")
    api.reconcile()
    got = streams(api)
    assert set(got) == {f"{MODEL} chat@r1 b1 pinned", f"{MODEL} chat@r1 b4 pinned", f"{MODEL} * mixed production",
                        f"{MODEL} chat@r1 mixed production", f"{MODEL} chat@r2 mixed production"}
    assert got[f"{MODEL} * mixed production"].divergence.probes == 12  # only the production-path probes
    assert got[f"{MODEL} chat@r1 b1 pinned"].divergence.probes == 12  # its pinned probes only
    assert got[f"{MODEL} chat@r1 mixed production"].divergence.probes == 6  # the production probes it served
    assert got[f"{MODEL} chat@r1 b1 pinned"].verdict == "healthy"
    assert got[f"{MODEL} chat@r2 mixed production"].verdict == "not_measured"  # 6 < canary_min_probes
    assert got[f"{MODEL} chat@r1 b1 pinned"].p0 == 0.05  # the clean reference's bound is below the floor
    assert events(api) == [("pinned", R1, "1", "not_measured", "healthy"), ("pinned", R1, "4", "not_measured", "healthy"),
                           ("production", "*", "None", "not_measured", "healthy")]
    api.reconcile()  # nothing new: nothing written, no event
    assert len(events(api)) == 3


def test_misrouted_answers_alarm_the_stream_of_what_their_class_served_not_diluted_by_its_pinned_ones(
        api: Api) -> None:
    """A correctness-different revision's pinned probes pass the golden set's tolerance; the production probes
    it served by mistake are held to the model's reference, and fail. Their stream alarms on its own."""
    ref = two_revisions(api)
    add_probes(api, ref, R1, 30, kind="production", engine="chat-0")
    add_probes(api, ref, R2, 40, engine="chat-b-0")  # pinned, within tolerance
    add_probes(api, ref, R2, 8, kind="production", diverged=True, engine="chat-b-0")
    api.reconcile()
    got = streams(api)
    assert got[f"{MODEL} chat@r2 b1 pinned"].verdict == "healthy"
    assert got[f"{MODEL} chat@r2 mixed production"].verdict == "drifting"
    alert = next(e for e in canary_audit(api) if e["target"] == f"canary/{MODEL}|production|{R2}|")
    assert alert["action"] == "canary.alert"
    assert "production path served by chat@r2: not_measured -> drifting" in alert["reason"]
    assert quality(api, R2) == "fail" and quality(api, R1) is None


def test_a_drifting_class_alerts_with_an_event_an_audit_entry_and_the_metric_then_recovers(api: Api) -> None:
    ref = two_revisions(api)
    add_probes(api, ref, R2, 10)
    api.reconcile()
    add_probes(api, ref, R2, 6, diverged=True)  # 6 x 8 = 48 >= 45 steps of 1/9 at the default target
    api.reconcile()
    stream = streams(api)[f"{MODEL} chat@r2 b1 pinned"]
    assert stream.verdict == "drifting" and stream.divergence.alarmed_at is not None
    assert events(api)[-1] == ("pinned", R2, "1", "healthy", "drifting")
    alert = canary_audit(api)[-1]
    assert (alert["actor"], alert["action"], alert["target"]) == ("controller", "canary.alert", f"canary/{MODEL}|pinned|{R2}|1")
    assert "chat@r2 b1: healthy -> drifting" in alert["reason"] and "6 bad of 16 probes" in alert["reason"]
    samples = parse_samples(api.call("GET", "/metrics", role=None).text)
    assert sum_series(samples, "fleet_canary_verdict", model=MODEL, **{"class": R2, "batch": "b1"}) == 1.0
    assert sum_series(samples, "fleet_canary_statistic", model=MODEL, **{"class": R2, "batch": "b1"}) == pytest.approx(48 / 9)

    add_probes(api, ref, R2, 19)
    api.reconcile()
    assert streams(api)[f"{MODEL} chat@r2 b1 pinned"].verdict == "drifting"  # held until the recovery run
    add_probes(api, ref, R2, 1)
    api.reconcile()
    assert events(api)[-1] == ("pinned", R2, "1", "drifting", "healthy")
    assert canary_audit(api)[-1]["action"] == "canary.recovered"
    samples = parse_samples(api.call("GET", "/metrics", role=None).text)
    assert sum_series(samples, "fleet_canary_verdict", model=MODEL, **{"class": R2, "batch": "b1"}) == 0.0


def test_the_production_stream_alarms_blaming_the_class_serving_bad_answers(api: Api) -> None:
    ref = two_revisions(api)
    add_probes(api, ref, R1, 20, kind="production", engine="chat-0")
    add_probes(api, ref, R2, 8, kind="production", diverged=True, engine="chat-b-0")
    api.reconcile()
    assert events(api)[-1][:2] == ("production", "*") and events(api)[-1][-1] == "drifting"
    alert = canary_audit(api)[-1]
    assert alert["action"] == "canary.alert" and alert["reason"].endswith("blamed: chat@r2 chat-b-0")
    samples = parse_samples(api.call("GET", "/metrics", role=None).text)
    assert sum_series(samples, "fleet_canary_verdict", model=MODEL, **{"class": "*", "batch": "mixed"}) == 1.0


def test_wrong_answers_fail_the_class(api: Api) -> None:
    ref = two_revisions(api)
    add_probes(api, ref, R2, 10, answer_bad=False)
    add_probes(api, ref, R2, 6, diverged=True, answer_bad=True)
    api.reconcile()
    assert streams(api)[f"{MODEL} chat@r2 b1 pinned"].verdict == "failing"
    samples = parse_samples(api.call("GET", "/metrics", role=None).text)
    assert sum_series(samples, "fleet_canary_verdict", model=MODEL, **{"class": R2, "batch": "b1"}) == 2.0


def test_a_class_no_longer_deployed_is_not_measured_and_starts_afresh(api: Api) -> None:
    ref = two_revisions(api)
    add_probes(api, ref, R2, 12)
    api.reconcile()
    deploy(api, "chat-b", R2, 0)
    api.reconcile()
    stream = streams(api)[f"{MODEL} chat@r2 b1 pinned"]
    assert stream.verdict == "not_measured" and stream.divergence.probes == 0 and stream.last_probe_id == 12
    assert events(api)[-1] == ("pinned", R2, "1", "healthy", "not_measured")
    assert "no longer deployed" in canary_audit(api)[-1]["reason"]
    add_probes(api, ref, R2, 3)  # stragglers in flight when it went: not judged
    api.reconcile()
    assert streams(api)[f"{MODEL} chat@r2 b1 pinned"].divergence.probes == 0


def test_failed_probes_move_the_cursor_and_a_run_is_bounded(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    ref = two_revisions(api)
    monkeypatch.setattr(canary_verdicts, "MAX_PROBES_PER_RUN", 5)
    add_probes(api, ref, R1, 4, failed=True)
    add_probes(api, ref, R1, 8)
    runtime = api.runtime
    reconciler = verdict_reconciler(api)
    with runtime.store.session() as session:
        now = api.clock()
        decision = reconciler.decide(reconciler.snapshot(session, now), now)
        result = reconciler.apply(session, decision, now)
    assert decision.full and result.requeue_after == 0.0
    first = streams(api)[f"{MODEL} chat@r1 b1 pinned"]
    assert (first.last_probe_id, first.divergence.probes) == (5, 1)
    api.reconcile()
    api.reconcile()
    done = streams(api)[f"{MODEL} chat@r1 b1 pinned"]
    assert (done.last_probe_id, done.divergence.probes) == (12, 8)


class Receiver:
    """A webhook receiver on loopback: records each POSTed JSON body."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.got = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                receiver.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()
                receiver.got.set()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/hook?token=s3cret"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def api_with_webhook(settings: ControllerSettings, url: str) -> tuple[TestClient, Api]:
    clock = Clock()
    runtime = ControllerRuntime(settings.model_copy(update={"canary_webhook_url": url}), clock=clock)
    http = TestClient(create_app(runtime=runtime))
    http.__enter__()
    return http, Api(http, runtime, role_tokens(runtime.store), clock)


def test_an_alert_is_posted_to_the_webhook_after_the_run_commits(settings: ControllerSettings, receiver: Receiver) -> None:
    http, api = api_with_webhook(settings, receiver.url)
    try:
        ref = two_revisions(api)
        add_probes(api, ref, R2, 10)
        api.reconcile()
        assert not receiver.got.wait(0.3)  # not measured -> healthy is recorded, not posted
        add_probes(api, ref, R2, 6, diverged=True)
        api.reconcile()
        assert receiver.got.wait(5)
        body = receiver.bodies[-1]
        assert (body["event"], body["model"], body["class_ref"], body["batch"]) == ("canary.alert", MODEL, R2, "b1")
        assert (body["verdict_from"], body["verdict_to"]) == ("healthy", "drifting")
        assert body["evidence"]["threshold"] == pytest.approx(45 / 9)
        with api.runtime.store.session() as session:
            assert body["id"] == session.query(CanaryEvent).order_by(CanaryEvent.id.desc()).first().id
    finally:
        http.__exit__(None, None, None)


def test_a_failing_webhook_never_fails_the_run_and_its_log_hides_the_query(
        settings: ControllerSettings, receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    port = receiver.server.server_port
    receiver.close()  # nothing listens there any more
    http, api = api_with_webhook(settings, f"http://127.0.0.1:{port}/hook?token=s3cret")
    threads: list[threading.Thread] = []
    try:
        reconciler = verdict_reconciler(api)
        original = reconciler.post
        reconciler.post = lambda url, payloads: threads.append(original(url, payloads))  # keep the thread to join
        ref = two_revisions(api)
        add_probes(api, ref, R2, 10)
        add_probes(api, ref, R2, 6, diverged=True)
        with caplog.at_level(logging.WARNING, logger="fleetctl.controller.canary_webhook"):
            api.reconcile()
            for t in threads:
                t.join(5)
        assert events(api)[-1][-1] == "drifting"  # the run committed
        with api.runtime.store.session() as session:
            assert session.get(CanaryStream, f"{MODEL}|pinned|{R2}|1").verdict == "drifting"
        assert threads and any("canary webhook http://127.0.0.1" in r.getMessage() for r in caplog.records)
        assert all("s3cret" not in r.getMessage() for r in caplog.records)
    finally:
        http.__exit__(None, None, None)

"""The canary's streams in the store (canary_streams rows, each a types.StreamState), and what is read of
them: the verdict views the API serves, the rollout gate's `quality`, and the /metrics samples.

A stream's row key is 'model|kind|class_ref|condition', with '' for the production stream's None parts.
Its tests' designs are not stored: they follow from the noise bounds the state keeps (p0, answer_p0) and
the settings (the false-alarm target, the stream's probe interval, the shift), so a changed setting takes
effect at the next fold and every reader computes the same thresholds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from fleetctl.canary import cusum
from fleetctl.canary.types import ProbeRecord, Score, StreamKey, StreamState, StreamVerdict
from fleetctl.canary.verdict import ALARMS, StreamDesigns, class_quality, stream_verdict
from fleetctl.controller.models import CanaryProbe, CanaryStream
from fleetctl.controller.settings import ControllerSettings

VERDICT_CODES = {"healthy": 0.0, "drifting": 1.0, "failing": 2.0, "not_measured": -1.0}  # fleet_canary_verdict


@dataclass(frozen=True)
class DesignSettings:
    """What the tests' thresholds follow from (ControllerSettings' canary_* fields)."""

    false_alarm_days: float
    shift: float
    pinned_interval_s: float
    production_interval_s: float

    @classmethod
    def of(cls, settings: ControllerSettings) -> "DesignSettings":
        return cls(settings.canary_false_alarm_days, settings.canary_shift, settings.canary_pinned_interval_s,
                   settings.canary_production_interval_s)

    def interval_s(self, key: StreamKey) -> float:
        """Seconds between the stream's observations at its configured rate: a pinned probe at batch
        condition c is c scored rows at once, so its stream sees c observations per pinned interval."""
        if key.kind == "pinned":
            return self.pinned_interval_s / (key.condition or 1)
        return self.production_interval_s


def designs_for(key: StreamKey, p0: float | None, answer_p0: float | None, settings: DesignSettings) -> StreamDesigns | None:
    """The stream's designs for its noise bounds; None without a bound (nothing judged yet)."""
    if p0 is None:
        return None
    target = cusum.target_arl0(settings.false_alarm_days, settings.interval_s(key))
    answer = cusum.design(answer_p0, settings.shift, target) if answer_p0 is not None else None
    return StreamDesigns(cusum.design(p0, settings.shift, target), answer)


def row_key(key: StreamKey) -> str:
    condition = "" if key.condition is None else str(key.condition)
    return f"{key.model}|{key.kind}|{key.class_ref or ''}|{condition}"


def key_of(row: CanaryStream) -> StreamKey:
    return StreamKey(row.model, row.kind, row.class_ref, row.condition)  # type: ignore[arg-type]


def load_streams(session: Session, model: str | None = None, class_ref: str | None = None) -> list[tuple[StreamKey, StreamState]]:
    """Stored streams in key order; `model`, `class_ref` filter (a class filter keeps the production stream
    of the class's model, which may blame it)."""
    query = select(CanaryStream)
    if model is not None:
        query = query.where(CanaryStream.model == model)
    rows = list(session.execute(query).scalars())
    streams = sorted(((key_of(r), StreamState.model_validate(r.state)) for r in rows), key=_order)
    if class_ref is None:
        return streams
    models = {k.model for k, _ in streams if k.class_ref == class_ref}
    return [(k, s) for k, s in streams
            if k.class_ref == class_ref or (k.kind == "production" and k.class_ref is None and k.model in models)]


def _order(item: tuple[StreamKey, StreamState]) -> tuple[str, int, str, int]:
    key = item[0]
    return key.model, 0 if key.kind == "production" else 1, key.class_ref or "", key.condition or 0


def probe_record(row: CanaryProbe) -> ProbeRecord:
    return ProbeRecord(id=row.id, at=row.at, model=row.model, kind=row.kind,  # type: ignore[arg-type]
                       class_ref=row.class_ref, engine=row.engine, condition=row.condition, batch_size=row.batch_size,
                       prompt_id=row.prompt_id, reference_id=row.reference_id,
                       score=Score.model_validate(row.score) if row.score is not None else None,
                       prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens, error=row.error)


def probes_by_id(session: Session, ids: Iterable[int]) -> dict[int, ProbeRecord]:
    wanted = sorted(set(ids))
    found: dict[int, ProbeRecord] = {}
    for start in range(0, len(wanted), 500):  # bounded IN lists
        chunk = wanted[start:start + 500]
        for row in session.execute(select(CanaryProbe).where(CanaryProbe.id.in_(chunk))).scalars():
            found[row.id] = probe_record(row)
    return found


def stream_verdicts(session: Session, settings: DesignSettings | None, model: str | None = None,
                    class_ref: str | None = None) -> list[StreamVerdict]:
    """Every stored stream's verdict; with `settings`, each with its evidence (else only what the rollout
    gate needs: the verdicts, and what an alarmed production stream blames)."""
    streams = load_streams(session, model, class_ref)
    wanted = [i for k, s in streams if settings is not None or (k.kind == "production" and s.verdict in ALARMS)
              for i in s.recent]
    window = probes_by_id(session, wanted)
    views = []
    for key, state in streams:
        designs = designs_for(key, state.p0, state.answer_p0, settings) if settings is not None else None
        views.append(stream_verdict(key, state, designs, [window[i] for i in state.recent if i in window]))
    return views


def quality(session: Session, model: str, refs: Iterable[str]) -> dict[str, str | None]:
    """The rollout gate's verdict per class revision (verdict.class_quality): 'pass', 'fail' or None."""
    verdicts = stream_verdicts(session, None, model)
    return {ref: class_quality(verdicts, ref) for ref in refs}


MetricSample = tuple[str, str, str, float, float]  # (model, class, batch, verdict code, statistic)


def metric_samples(session: Session) -> list[MetricSample]:
    """fleet_canary_verdict / fleet_canary_statistic: the production stream as class '*', batch 'mixed'."""
    samples = []
    for key, state in load_streams(session):
        batch = "mixed" if key.condition is None else f"b{key.condition}"
        statistic = state.trend[-1] if state.trend else 0.0
        samples.append((key.model, key.class_ref or "*", batch, VERDICT_CODES[state.verdict], statistic))
    return samples

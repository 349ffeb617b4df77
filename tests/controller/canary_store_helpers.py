"""Helpers for the canary verdict tests: a golden set and a reference stored as the recorder stores them,
and scored probes stored as the probe executor stores them (canary_probes rows), so the verdict reconciler
runs on exactly what it reads in production. The CLI tests import it as tests.controller.canary_store_helpers."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from fleetctl.canary.types import (
    ConditionNoise, GoldenPrompt, GoldenSet, ProbeRecord, PromptReference, Reference, Score,
)
from fleetctl.controller.models import CanaryProbe, CanaryReference, GoldenSetRow

if TYPE_CHECKING:  # any object with .runtime (its store) and .clock will do (the CLI tests pass their own)
    from ctl_helpers import Api

MODEL = "smollm2-135m"
PROMPTS = ("sum", "capital", "echo")


def store_reference(api: Api, class_ref: str, runs: int = 200, diverged: int = 0, floor: float = 0.05) -> int:
    """A golden set of three prompts (the first with an expected answer its reference passed) and a clean
    reference recorded from `class_ref` at batch conditions 1 and 4. Returns the reference's id."""
    golden = GoldenSet(name="golden", version=1, model=MODEL, p0_floor=floor,
                       prompts=[GoldenPrompt(id=p, prompt=f"{p}?") for p in PROMPTS])
    noise = {c: ConditionNoise(runs=runs, diverged=diverged) for c in (1, 4)}
    reference = Reference(
        golden_set="golden", golden_version=1, model=MODEL, class_ref=class_ref, correctness_digest="d" * 64,
        recorded_at=api.clock(), recorded_by="test",
        prompts={p: PromptReference(prompt_id=p, tokens=[1, 2], text="x", top_logprobs=[[(1, 0.0)], [(2, 0.0)]],
                                    expected_pass=True if p == "sum" else None, noise=noise) for p in PROMPTS})
    with api.runtime.store.session() as session:
        if session.get(GoldenSetRow, ("golden", 1)) is None:
            session.add(GoldenSetRow(name="golden", version=1, model=MODEL, digest="0" * 64,
                                     body=golden.model_dump(mode="json"), created_at=api.clock(), created_by="test"))
        row = CanaryReference(model=MODEL, golden_set="golden", golden_version=1, class_ref=class_ref,
                              correctness_digest="d" * 64, body=reference.model_dump(mode="json"),
                              recorded_at=api.clock(), recorded_by="test")
        session.add(row)
        session.flush()
        return row.id


def add_probes(api: Api, reference_id: int, class_ref: str | None, n: int, *, diverged: bool = False,
               answer_bad: bool | None = None, kind: str = "pinned", condition: int = 1, engine: str | None = "e-0",
               failed: bool = False, step_s: float = 1.0) -> None:
    """`n` scored probes, `step_s` apart from the clock's time (which moves on past them)."""
    with api.runtime.store.session() as session:
        for i in range(n):
            at: datetime = api.clock() + timedelta(seconds=i * step_s)
            score = None if failed else Score(match=not diverged, first_divergence=2 if diverged else None,
                                              distance=0.4 if diverged else 0.0, diverged=diverged,
                                              answer_bad=answer_bad)
            record = ProbeRecord(at=at, model=MODEL, kind=kind, class_ref=class_ref, engine=engine,  # type: ignore[arg-type]
                                 condition=condition, prompt_id=PROMPTS[i % len(PROMPTS)], reference_id=reference_id,
                                 score=score, error="timeout" if failed else None)
            session.add(CanaryProbe(**record.model_dump(mode="python", exclude={"id", "score"}),
                                    score=score.model_dump(mode="json") if score is not None else None))
    api.clock.advance(n * step_s)

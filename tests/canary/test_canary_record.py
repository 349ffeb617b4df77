"""Recording a reference with an injected `send` (the serving path's answers scripted per prompt and batch
condition): the reference is the modal answer of the batch-1 runs, each condition's noise counts the runs that
differ from it and their largest top-k distance over the matching prefix, the expected answer is judged on the
reference's text, and the progress says one line per prompt."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timezone

import pytest

from fleetctl.canary import distance
from fleetctl.canary.golden import parse_golden
from fleetctl.canary.record import RecordingError, modal_run, record_reference
from fleetctl.canary.types import GoldenPrompt, ProbeOutput, Reference

NOW = datetime(2026, 3, 1, tzinfo=timezone.utc)
GOLDEN = parse_golden({"name": "mini", "version": 2, "model": "tiny", "prompts": [
    {"id": "paris", "messages": [{"role": "user", "content": "capital of France?"}], "expected": {"regex": "Paris"}},
    {"id": "count", "prompt": "1, 2, 3,", "expected": {"exact": "4, 5"}},
    {"id": "free", "prompt": "Once", "sampling": {"temperature": 0.7, "seed": 3}},
]}, source="mini")
SURE = [(1, -0.01), (2, -5.0)]  # a confident position: token 1, then 2
UNSURE = [(1, -0.7), (2, -0.7)]  # a near-tie


def output(prompt_id: str, tokens: list[int], text: str, top: list | None = None, class_ref: str = "tiny@r1") -> ProbeOutput:
    return ProbeOutput(prompt_id=prompt_id, tokens=tokens, text=text, top_logprobs=top or [SURE] * len(tokens),
                       class_ref=class_ref, engine="e1")


class Scripted:
    """A send that answers from a script: (prompt id, fillers) -> answers in order, the last one repeated."""

    def __init__(self, script: dict[tuple[str, int], list[ProbeOutput]]):
        self.script = script
        self.calls: list[tuple[str, int]] = []
        self.seen: dict[tuple[str, int], int] = defaultdict(int)

    async def __call__(self, prompt: GoldenPrompt, fillers: int) -> ProbeOutput:
        key = (prompt.id, fillers)
        self.calls.append(key)
        answers = self.script[key]
        index = min(self.seen[key], len(answers) - 1)
        self.seen[key] += 1
        return answers[index]


def record(send: Callable, **kwargs) -> Reference:
    return asyncio.run(record_reference(send, GOLDEN, "tiny@r1", "d" * 64, recorded_by="test", now=NOW, **kwargs))


def steady(prompt_id: str, tokens: list[int], text: str) -> dict[tuple[str, int], list[ProbeOutput]]:
    return {(prompt_id, f): [output(prompt_id, tokens, text)] for f in (0, 3, 7, 15)}


def test_a_steady_class_has_no_noise_and_every_run_is_sent() -> None:
    send = Scripted({**steady("paris", [5, 6], "Paris."), **steady("count", [7], " 4, 5, 6"),
                     **steady("free", [8, 9, 10], " upon")})
    lines: list[str] = []
    reference = record(send, progress=lines.append)
    assert (reference.golden_set, reference.golden_version, reference.model) == ("mini", 2, "tiny")
    assert (reference.class_ref, reference.correctness_digest, reference.recorded_at) == ("tiny@r1", "d" * 64, NOW)
    assert len(send.calls) == 3 * 4 * 3  # prompts x conditions x repetitions, fillers = condition - 1
    assert send.calls[:12] == [("paris", f) for f in (0, 3, 7, 15) for _ in range(3)]
    paris = reference.prompts["paris"]
    assert (paris.tokens, paris.text, paris.expected_pass) == ([5, 6], "Paris.", True)
    assert {c: (n.runs, n.diverged, n.max_distance) for c, n in paris.noise.items()} == \
        {1: (3, 0, 0.0), 4: (3, 0, 0.0), 8: (3, 0, 0.0), 16: (3, 0, 0.0)}
    assert reference.prompts["count"].expected_pass is True and reference.prompts["free"].expected_pass is None
    assert lines == ["paris: 2 tokens; diverged b1 0/3, b4 0/3, b8 0/3, b16 0/3; expected: pass",
                     "count: 1 tokens; diverged b1 0/3, b4 0/3, b8 0/3, b16 0/3; expected: pass",
                     "free: 3 tokens; diverged b1 0/3, b4 0/3, b8 0/3, b16 0/3"]


def test_the_reference_is_the_modal_batch_1_answer_and_noise_counts_the_rest() -> None:
    odd = output("paris", [5, 9], "Pa", top=[SURE, UNSURE])
    modal = output("paris", [5, 6], "Paris.", top=[SURE, SURE])
    batched = output("paris", [5, 6, 7], "Paris..", top=[UNSURE, SURE, SURE])  # longer: diverges at 2
    send = Scripted({("paris", 0): [odd, modal, modal], ("paris", 3): [modal, batched, batched],
                     **steady("count", [7], " 3"), **steady("free", [8], " upon")})
    reference = record(send, conditions=(1, 4))
    paris = reference.prompts["paris"]
    assert (paris.tokens, paris.text, paris.top_logprobs) == ([5, 6], "Paris.", [SURE, SURE])
    assert (paris.noise[1].runs, paris.noise[1].diverged) == (3, 1)
    # the odd run matches the reference only at position 0 (identical distributions there)
    assert paris.noise[1].max_distance == 0.0
    assert (paris.noise[4].runs, paris.noise[4].diverged) == (3, 2)
    # the batched runs match 2 positions: position 0 is UNSURE against SURE, position 1 is identical
    expected = distance.topk_distance([UNSURE, SURE], [SURE, SURE])
    assert paris.noise[4].max_distance == pytest.approx(expected) and expected > 0.2
    assert set(paris.noise) == {1, 4}
    assert reference.prompts["count"].expected_pass is False  # " 3" is not "4, 5": left out of the answer test


def test_a_tie_goes_to_the_first_answer_seen() -> None:
    first, second = output("free", [1], "a"), output("free", [2], "b")
    assert modal_run([first, second]).tokens == [1]
    assert modal_run([second, first, first]).tokens == [1]


def test_without_batch_1_the_smallest_condition_is_the_reference() -> None:
    send = Scripted({**steady("paris", [5], "Paris"), **steady("count", [7], "4, 5"), **steady("free", [8], "x")})
    reference = record(send, conditions=(8, 4), repetitions=1)
    assert set(reference.prompts["paris"].noise) == {4, 8}
    assert [f for _, f in send.calls[:2]] == [3, 7]


def test_an_answer_served_by_another_class_fails_the_recording() -> None:
    send = Scripted({("paris", 0): [output("paris", [5], "Paris", class_ref="tiny@r2")]})
    with pytest.raises(RecordingError, match="'paris' was served by tiny@r2, not tiny@r1"):
        record(send)


def test_repetitions_and_conditions_must_be_positive() -> None:
    with pytest.raises(ValueError):
        record(Scripted({}), repetitions=0)
    with pytest.raises(ValueError):
        record(Scripted({}), conditions=(0, 4))

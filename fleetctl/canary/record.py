"""Recording a reference: what a known-good class revision answers to each golden prompt, and how much its own
answers vary between runs and batch conditions (its noise), which the drift tests take as their baseline.

Per prompt, `repetitions` runs at each batch condition (condition c: c - 1 concurrent fillers). The reference
answer is the most common token sequence among the batch-1 runs (the first seen on a tie), with that run's
text and top-k logprobs. Per condition, the noise counts the runs whose tokens differ from the reference and
the largest top-k distance to it over the matching prefix (distance.topk_distance). `expected_pass` says
whether the reference's own text passes the prompt's expected answer (prompts whose reference fails it are
left out of the answer test).

`send(prompt, fillers)` does the I/O: the CLI binds probe_client.send_probe pinned to the class revision, the
tests inject their own. Runs are sequential; a probe that fails fails the recording (nothing is stored).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from fleetctl.canary import distance
from fleetctl.canary.types import (
    BATCH_CONDITIONS, ConditionNoise, GoldenPrompt, GoldenSet, ProbeOutput, PromptReference, Reference,
)
from fleetctl.errors import FleetError

SendProbe = Callable[[GoldenPrompt, int], Awaitable[ProbeOutput]]


class RecordingError(FleetError):
    """The serving path answered in a way a reference cannot be recorded from (another class served it)."""

    status = 502
    code = "recording_failed"


async def record_reference(send: SendProbe, golden: GoldenSet, class_ref: str, correctness_digest: str, *,
                           repetitions: int = 3, conditions: Sequence[int] = BATCH_CONDITIONS, recorded_by: str,
                           now: datetime, progress: Callable[[str], None] = lambda line: None) -> Reference:
    if repetitions < 1:
        raise ValueError("repetitions must be at least 1")
    if not conditions or min(conditions) < 1:
        raise ValueError("conditions must be batch sizes of at least 1")
    prompts: dict[str, PromptReference] = {}
    for prompt in golden.prompts:
        runs = {condition: [await _run(send, prompt, condition, class_ref) for _ in range(repetitions)]
                for condition in sorted(set(conditions))}
        prompts[prompt.id] = prompt_reference(prompt, runs)
        progress(progress_line(prompts[prompt.id]))
    return Reference(golden_set=golden.name, golden_version=golden.version, model=golden.model, class_ref=class_ref,
                     correctness_digest=correctness_digest, recorded_at=now, recorded_by=recorded_by, prompts=prompts)


def prompt_reference(prompt: GoldenPrompt, runs: dict[int, list[ProbeOutput]]) -> PromptReference:
    """The reference of one prompt from its runs per condition (pure). The modal answer of the smallest
    condition's runs (batch 1 when it was run) is the reference."""
    reference = modal_run(runs[min(runs)])
    noise = {condition: condition_noise(reference, outputs) for condition, outputs in sorted(runs.items())}
    expected = None if prompt.expected is None else distance.expected_passes(reference.text, prompt.expected)
    return PromptReference(prompt_id=prompt.id, tokens=reference.tokens, text=reference.text,
                           top_logprobs=reference.top_logprobs, expected_pass=expected, noise=noise)


def modal_run(outputs: Sequence[ProbeOutput]) -> ProbeOutput:
    """The first run whose token sequence is the most common one (Counter keeps first-seen order on ties)."""
    counts = Counter(tuple(output.tokens) for output in outputs)
    modal = counts.most_common(1)[0][0]
    return next(output for output in outputs if tuple(output.tokens) == modal)


def condition_noise(reference: ProbeOutput, outputs: Sequence[ProbeOutput]) -> ConditionNoise:
    diverged = sum(1 for output in outputs if output.tokens != reference.tokens)
    distances = [distance.topk_distance(output.top_logprobs, reference.top_logprobs,
                                        upto=distance.first_divergence(output.tokens, reference.tokens))
                 for output in outputs]
    return ConditionNoise(runs=len(outputs), diverged=diverged, max_distance=max(distances, default=0.0))


def progress_line(reference: PromptReference) -> str:
    noise = ", ".join(f"b{c} {n.diverged}/{n.runs}" for c, n in sorted(reference.noise.items()))
    answer = {None: "", True: "; expected: pass", False: "; expected: FAIL"}[reference.expected_pass]
    return f"{reference.prompt_id}: {len(reference.tokens)} tokens; diverged {noise}{answer}"


async def _run(send: SendProbe, prompt: GoldenPrompt, condition: int, class_ref: str) -> ProbeOutput:
    output = await send(prompt, condition - 1)
    if output.class_ref is not None and output.class_ref != class_ref:
        raise RecordingError(f"prompt {prompt.id!r} was served by {output.class_ref}, not {class_ref}: "
                             "a reference must come from the class revision it names")
    return output

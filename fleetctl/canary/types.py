"""The canary's shared plain data. Everything here is a pydantic model (stored as JSON, served by the API)
or a frozen dataclass, with no I/O: the controller, the CLI, the simulator and the tests all pass these.

Vocabulary:
- a *golden set* is a versioned file of prompts with fixed sampling and optional expected answers;
- a *reference* is what a known-good class revision answered to each prompt (token ids, top-k logprobs) and
  how much its own answers vary between runs and batch conditions (its *noise*);
- a *probe* is one golden prompt sent through the gateway, either *pinned* to a class revision
  (x-fleet-pin-class, at a batch condition) or on the *production* path (unpinned, attributed afterwards
  by x-fleet-served-by);
- a *stream* is the sequence of probe scores one sequential test watches: pinned streams are per
  (model, class revision, batch condition), the production stream is per model;
- a *verdict* is what the tests say of a stream now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The engine's running batch is a correctness variable (an approximate top-k kernel was wrong only at some
# batch sizes), so pinned probes run at several batch conditions. A probe's condition is the largest of these
# at or below the batch size the engine reported for the steps that served it ("b4" = a batch of 4..7).
BATCH_CONDITIONS: tuple[int, ...] = (1, 4, 8, 16)

ProbeKind = Literal["pinned", "production"]
Verdict = Literal["healthy", "drifting", "failing", "not_measured"]
CompareMode = Literal["exact", "tolerance"]  # exact: the reference came from a class with the same
# correctness fields, so greedy tokens must match up to the class's own noise; tolerance: it came from a
# correctness-different class (a long-context build), held to the golden set's tolerance instead
VERDICTS: tuple[Verdict, ...] = ("healthy", "drifting", "failing", "not_measured")
PROBES_FLAG = "canary_probes"  # the kill switch: no probe is sent while this feature flag is false


def condition_for(batch_size: int | None) -> int:
    """The batch condition of a probe the engine served at `batch_size` (None: unknown, counted as 1)."""
    size = batch_size or 1
    return max(c for c in BATCH_CONDITIONS if c <= size) if size >= 1 else 1


def condition_label(condition: int | None) -> str:
    """'b1', 'b4', ... for pinned streams; 'mixed' for the production stream (None)."""
    return "mixed" if condition is None else f"b{condition}"


def stream_name(key: "StreamKey") -> str:
    """The stream in words, after its model: 'chat@r2 b4', 'production path mixed', 'production path served
    by chat@r2'."""
    if key.kind == "pinned":
        return f"{key.class_ref} {condition_label(key.condition)}"
    return f"production path served by {key.class_ref}" if key.class_ref else "production path mixed"


# --- golden sets (the file format; validation lives in golden.py) ----------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Sampling(_Strict):
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="0: greedy")
    seed: int | None = Field(default=None, ge=0, lt=2**63, description="required when temperature > 0")
    max_tokens: int = Field(default=16, gt=0, le=512)
    top_logprobs: int = Field(default=5, ge=1, le=20, description="top-k logprobs recorded at each position")


class Expected(_Strict):
    """An answer the output must contain: exactly this text (after stripping), or a regex that must match."""

    exact: str | None = None
    regex: str | None = None


class GoldenPrompt(_Strict):
    id: str = Field(min_length=1, max_length=63, description="unique in the set")
    task: Literal["arithmetic", "fact", "extraction", "code", "instruction", "free"] = "free"
    messages: list[dict[str, str]] | None = Field(default=None, description="chat: [{role, content}]")
    prompt: str | None = Field(default=None, description="completion: the prompt text")
    sampling: Sampling = Field(default_factory=Sampling)
    expected: Expected | None = None


class Tolerance(_Strict):
    """How a class is judged against a reference recorded from a correctness-different class."""

    max_distance: float = Field(default=0.5, ge=0.0, description="top-k logprob distance (mean total variation "
                                "over the matching prefix) above which a probe counts as diverged")
    require_expected: bool = Field(default=True, description="a failed expected answer counts as diverged")


class GoldenSet(_Strict):
    name: str = Field(min_length=1, max_length=63)
    version: int = Field(ge=1)
    model: str = Field(min_length=1, description="the served model name the prompts are for")
    description: str = ""
    p0_floor: float = Field(default=0.01, gt=0.0, lt=0.5, description="the smallest per-probe noise rate "
                            "assumed for a stream, however clean its recorded runs were")
    tolerance: Tolerance = Field(default_factory=Tolerance)
    # Exact mode also compares distributions: a reduced-precision KV cache moves logprobs without flipping a
    # greedy token. A probe diverges when its distance exceeds noise_margin x the largest distance the
    # recording class showed against itself at that batch condition, and never below distance_floor (float32
    # batch noise on CPU is ~1e-6; a float16 KV cache moves the tiny model by ~1e-4).
    noise_margin: float = Field(default=4.0, ge=1.0, description="exact mode: how far above its own recorded "
                                "noise a probe's top-k distance may go")
    distance_floor: float = Field(default=2e-5, ge=0.0, description="exact mode: the smallest top-k distance "
                                  "that counts as diverged")
    prompts: list[GoldenPrompt] = Field(min_length=1)


# --- what one request returned, and a reference -----------------------------------------------------------------

TopLogprobs = list[tuple[int, float]]  # [(token_id, logprob)], best first, at one position


class ProbeOutput(BaseModel):
    """One golden prompt's answer as the serving path returned it."""

    prompt_id: str
    tokens: list[int]
    text: str
    top_logprobs: list[TopLogprobs] = Field(description="per generated position")
    batch_size: int | None = Field(default=None, description="the largest running batch among the steps that "
                                   "served it, as the engine reported; None: the engine does not say (vLLM)")
    fillers: int = Field(default=0, description="concurrent filler requests sent alongside it")
    class_ref: str | None = Field(default=None, description="from x-fleet-served-by")
    engine: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0


class ConditionNoise(BaseModel):
    """The recording class's own variation at one batch condition."""

    runs: int = Field(ge=0)
    diverged: int = Field(ge=0, description="runs whose tokens differ from the reference tokens")
    max_distance: float = Field(default=0.0, ge=0.0, description="largest top-k distance seen between runs")


class PromptReference(BaseModel):
    prompt_id: str
    tokens: list[int]
    text: str
    top_logprobs: list[TopLogprobs]
    expected_pass: bool | None = Field(default=None, description="the reference's own answer passed the expected "
                                       "check (None: no expected answer); prompts that fail are left out of the "
                                       "answer test")
    noise: dict[int, ConditionNoise] = Field(default_factory=dict, description="batch condition -> noise")


class Reference(BaseModel):
    golden_set: str
    golden_version: int
    model: str
    class_ref: str = Field(description="the class revision it was recorded from")
    correctness_digest: str = Field(description="digest of that revision's correctness fields "
                                    "(replica_class.correctness_values): which classes compare exactly")
    recorded_at: datetime
    recorded_by: str
    prompts: dict[str, PromptReference]


# --- scores ----------------------------------------------------------------------------------------------------

class Score(BaseModel):
    """One probe against its reference (scoring.score_probe)."""

    match: bool = Field(description="greedy tokens identical to the reference's")
    first_divergence: int | None = Field(default=None, description="first position that differs; None if none")
    expected_pass: bool | None = Field(default=None, description="None: the prompt has no expected answer")
    distance: float = Field(ge=0.0, description="mean total variation between the top-k distributions over "
                            "the matching prefix")
    diverged: bool = Field(description="counts as 'bad' in the divergence test (mode-dependent)")
    answer_bad: bool | None = Field(default=None, description="counts as 'bad' in the answer test; None: the "
                                    "prompt is not in it")
    mode: CompareMode = "exact"
    tokens_digest: str | None = Field(default=None, description="digest of the answer's token ids "
                                      "(scoring.tokens_digest)")
    batch_variant: bool | None = Field(default=None, description="tolerance mode, batch above 1: the answer is not "
                                       "the class's own at batch 1 (None: not judged)")


class ProbeRecord(BaseModel):
    """One scored probe, as stored (canary_probes) and folded into its streams."""

    id: int | None = None
    at: datetime
    model: str
    kind: ProbeKind
    class_ref: str | None = Field(description="the revision that served it (production: from served-by)")
    engine: str | None = None
    condition: int = Field(description="batch condition (condition_for of the reported batch size)")
    batch_size: int | None = None
    prompt_id: str
    reference_id: int | None = None
    score: Score | None = Field(default=None, description="None when the probe failed (error set)")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


# --- streams, tests and verdicts ---------------------------------------------------------------------------------

@dataclass(frozen=True, order=True)
class StreamKey:
    """Pinned: (model, 'pinned', class_ref, condition). Production: (model, 'production', None, None), every
    production-path probe of the model; and (model, 'production', class_ref, None), those class_ref served."""

    model: str
    kind: ProbeKind
    class_ref: str | None = None
    condition: int | None = None

    def label(self) -> str:
        return f"{self.model} {self.class_ref or '*'} {condition_label(self.condition)}"


class CusumDesign(BaseModel):
    """A Bernoulli CUSUM in count units on a grid of 1/m (cusum.design): a good probe moves the statistic
    down one step, a bad one up m-1 steps; it alarms at `h_steps` steps (h_B = h_steps / m)."""

    model_config = ConfigDict(frozen=True)

    p0: float = Field(description="in-control bad rate (the noise, an upper bound)")
    p1: float = Field(description="bad rate to detect: p0 + shift * (1 - p0)")
    m: int = Field(ge=2, description="gamma = 1/m")
    h_steps: int = Field(ge=1)
    arl0: float = Field(description="average probes to a false alarm (exact, Brook-Evans)")
    arl1: float = Field(description="average probes to detect p1 from the start")
    target_arl0: float


class CusumState(BaseModel):
    steps: int = Field(default=0, ge=0, description="the statistic, in grid steps")
    probes: int = 0
    bad: int = 0
    alarmed_at: datetime | None = None


class StreamState(BaseModel):
    """What the verdict reconciler keeps per stream (canary_streams.state)."""

    divergence: CusumState = Field(default_factory=CusumState)
    answer: CusumState = Field(default_factory=CusumState)
    verdict: Verdict = "not_measured"
    since: datetime | None = None
    last_probe_id: int = 0
    recent: list[int] = Field(default_factory=list, description="ids of the latest probes (evidence), newest last")
    trend: list[float] = Field(default_factory=list, description="the divergence statistic (count units) after "
                               "each probe in `recent`")
    clean_run: int = Field(default=0, ge=0, description="consecutive good scored probes (recovery after an alarm)")
    recovered_at_probe: int = Field(default=0, ge=0, description="the probe whose good run last ended an alarm: "
                                    "the bad probes up to it belong to an incident the stream recovered from")
    p0: float | None = Field(default=None, description="the divergence test's noise bound at the last fold")
    answer_p0: float | None = Field(default=None, description="the answer test's; None: no prompt takes part")


class Evidence(BaseModel):
    """Why a verdict is what it is: the test statistics against their thresholds, and the worst prompts."""

    statistic: float = Field(description="divergence CUSUM in count units (h_B scale)")
    threshold: float
    answer_statistic: float | None = None
    answer_threshold: float | None = None
    probes: int
    bad: int
    bad_prompts: dict[str, int] = Field(default_factory=dict, description="prompt id -> bad probes in the window")
    first_divergence: int | None = None
    trend: list[float] = Field(default_factory=list, description="the statistic after each recent probe")
    served_by: dict[str, int] = Field(default_factory=dict, description="production stream: class_ref or "
                                      "'class_ref engine' -> bad probes it served")


class StreamVerdict(BaseModel):
    model: str
    kind: ProbeKind
    class_ref: str | None
    condition: int | None
    verdict: Verdict
    since: datetime | None
    evidence: Evidence | None = None
    blamed: str | None = Field(default=None, description="while alarmed: the class revision (and engine) "
                               "that served most of the bad answers ('class_ref engine' when one engine did)")

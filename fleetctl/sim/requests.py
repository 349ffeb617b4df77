"""A request twice over: `RequestSpec`, what the workload offers (immutable), and `SimRequest`, its state
while the simulation moves it through prefill and decode (mutable, owned by one run)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetctl.gateway.admission import AdmissionDecision


@dataclass(frozen=True)
class RequestSpec:
    request_id: int
    arrival_s: float  # simulated seconds from the start of the run
    prompt_tokens: int
    output_tokens: int  # what it will generate (the trace's length); at most max_tokens
    max_tokens: int  # what the client asks for: admission sees this, not output_tokens


@dataclass(eq=False, slots=True)
class SimRequest:
    spec: RequestSpec
    # the spec's lengths, copied: the snapshot reads them for every running sequence at every arrival
    prompt: int = field(init=False)
    output: int = field(init=False)
    max_tokens: int = field(init=False)
    decision: AdmissionDecision | None = None  # set at arrival
    failure_reason: str | None = None  # set when an engine refuses it
    prefill_engine: str | None = None
    decode_engine: str | None = None
    generated: int = 0
    first_token_s: float | None = None
    finished_s: float | None = None
    needs_recompute: bool = False  # preempted: its KV was dropped and is recomputed when it runs again
    preemptions: int = 0

    def __post_init__(self) -> None:
        self.prompt, self.output, self.max_tokens = self.spec.prompt_tokens, self.spec.output_tokens, self.spec.max_tokens

    @property
    def kv_tokens(self) -> int:
        """Tokens it holds in KV while it runs: the prompt and what it generated."""
        return self.prompt + self.generated

    @property
    def done(self) -> bool:
        return self.generated >= self.output

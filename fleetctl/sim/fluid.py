"""The fluid fleet: a coarse model of the same P/D fleet, for fleets of hundreds or thousands of engines.

The event-level fleet (fleet.py) pays for every decode step of every engine and, at every arrival, builds
the admission snapshot of every engine. At 1,024 engines that is hours per run. The fluid fleet keeps what
the P:D planner is judged on and drops what costs:

- **Decode as a rate.** Between two changes of an engine's batch (a sequence joins or leaves), every running
  sequence gains one token per `step_s(batch)` seconds, so the engine keeps one counter of steps done and
  each sequence the step count at which it finishes. Events happen only when a sequence finishes, not at
  every step: the cost is per request, not per token. A sequence's first token comes one step (at the batch
  it joins) after it joins.
- **Placement by heaps.** With admission off, the event-level fleet places a request on the prefill engine
  with the fewest queued prompt tokens and the decode engine with the fewest running plus admitted-ahead
  requests (policies.admit_all_policy). The fluid fleet makes the same choice from two heaps kept as
  engines change, instead of a snapshot of every engine (ties may go to another engine than the event
  model's).
- **No preemption.** A sequence joins a batch when a slot is free and its prompt fits the KV left; a batch
  is never cut to make room for its next tokens.

Prefill engines, role flips (drain, leave, join), samples and the engines' counters are the event-level
fleet's own, so `pd_control` (the planner and the threshold autoscaler) runs on it unchanged. Deterministic
like the event-level fleet. tests/sim/test_fluid.py holds the two models to each other on small fleets.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fleetctl.gateway.admission import AdmissionDecision
from fleetctl.sim.engines import EngineConstants, PrefillEngine
from fleetctl.sim.events import EventKind
from fleetctl.sim.fleet import Fleet, FleetShape
from fleetctl.sim.policies import Placement
from fleetctl.sim.requests import RequestSpec, SimRequest
from fleetctl.sim.results import SimResult
from fleetctl.sim.simulation import run_fleet

STEP_EPSILON = 1e-6  # steps: a sequence due within this is done (the step count is a float sum)
ADMISSION_OFF = AdmissionDecision(True, "admission off")


@dataclass(eq=False)
class FluidDecodeEngine:
    name: str
    slots: int  # max_num_seqs
    kv_capacity: int  # KV pool, in tokens
    constants: EngineConstants
    waiting: deque[SimRequest] = field(default_factory=deque)  # prefilled, waiting for a slot and KV
    running: dict[int, SimRequest] = field(default_factory=dict)  # in the batch, by request id
    bound: dict[int, SimRequest] = field(default_factory=dict)  # admitted here, still in prefill (by request id)
    steps: float = 0.0  # decode steps done since the engine started
    at_s: float = 0.0  # when `steps` was last brought up to date
    finishing: list[tuple[float, int, SimRequest]] = field(default_factory=list)  # heap: (steps when done, id, request)
    prompt_tokens_held: int = 0  # the running sequences' prompts
    joined_steps_sum: float = 0.0  # the step counts at which the running sequences joined
    version: int = 0  # bumped at every rescheduling; a STEP_DONE of an older version is stale
    preemptions: int = 0  # always 0: the fluid model never preempts
    # counters, as an engine reports them: sequences that got their first token, tokens generated
    started: int = 0
    generated_tokens: float = 0.0

    def load(self) -> int:
        """What placement compares: running plus admitted-ahead requests."""
        return len(self.running) + len(self.waiting) + len(self.bound)

    def kv_used(self) -> float:
        """Prompts plus the tokens generated so far by the running sequences."""
        return self.prompt_tokens_held + len(self.running) * self.steps - self.joined_steps_sum

    def advance(self, now: float) -> None:
        """Bring the step count to `now` at the current batch's step time."""
        if self.running:
            steps = (now - self.at_s) / self.constants.step_s(len(self.running))
            self.steps += steps
            self.generated_tokens += steps * len(self.running)
        self.at_s = now

    def finish_due(self, now: float) -> list[SimRequest]:
        finished = []
        while self.finishing and self.finishing[0][0] <= self.steps + STEP_EPSILON:
            done_at_steps, _, request = heapq.heappop(self.finishing)
            del self.running[request.spec.request_id]
            self.prompt_tokens_held -= request.prompt
            self.joined_steps_sum -= done_at_steps - request.output
            request.generated, request.finished_s = request.output, now
            if request.first_token_s is None or request.first_token_s > now:
                request.first_token_s = now
            finished.append(request)
        return finished

    def fill(self, now: float) -> None:
        """Move waiting sequences into free slots while their prompt fits the KV left (the first always
        fits an empty batch)."""
        while self.waiting and len(self.running) < self.slots:
            request = self.waiting[0]
            if self.running and self.kv_used() + request.prompt + 1 > self.kv_capacity:
                return
            self.waiting.popleft()
            self.running[request.spec.request_id] = request
            self.prompt_tokens_held += request.prompt
            self.joined_steps_sum += self.steps
            heapq.heappush(self.finishing, (self.steps + request.output, request.spec.request_id, request))
            request.first_token_s = now + self.constants.step_s(len(self.running))
            self.started += 1

    def next_finish_s(self, now: float) -> float | None:
        if not self.finishing:
            return None
        return now + max(0.0, self.finishing[0][0] - self.steps) * self.constants.step_s(len(self.running))

    def idle(self) -> bool:
        return not self.running and not self.waiting and not self.bound


class FluidFleet(Fleet):
    """The event-level fleet with fluid decode engines and heap placement (see the module doc)."""

    def __init__(self, shape: FleetShape) -> None:
        self._prefill_heap: list[tuple[float, str]] = []  # (when its queue drains, name), stale entries skipped
        self._decode_heap: list[tuple[int, str]] = []  # (load, name), stale entries skipped
        self._drains_at: dict[str, float] = {}
        super().__init__(shape)

    def least_loaded(self) -> Placement:
        """The event-level admit-all placement: fewest queued prompt tokens (the earliest drain), fewest
        running plus admitted-ahead requests."""
        return Placement(ADMISSION_OFF, self._top(self._prefill_heap, self._prefill_valid),
                         self._top(self._decode_heap, self._decode_valid))

    def step_done(self, payload: tuple[FluidDecodeEngine, int]) -> None:
        engine, version = payload
        if version != engine.version or engine.name not in self._decode_by_name:
            return  # rescheduled since
        self._start_step(engine)
        self._leave_if_drained(engine)

    def _new_decode(self, name: str) -> FluidDecodeEngine:  # type: ignore[override]
        return FluidDecodeEngine(name, self.shape.max_num_seqs, self.shape.kv_capacity_tokens, self.shape.constants,
                                 at_s=self.events.now)

    def _add_prefill(self, engine: PrefillEngine) -> str:
        self._drains_at[engine.name] = self.events.now
        heapq.heappush(self._prefill_heap, (self.events.now, engine.name))
        return super()._add_prefill(engine)

    def _add_decode(self, engine: FluidDecodeEngine) -> str:  # type: ignore[override]
        heapq.heappush(self._decode_heap, (0, engine.name))
        return super()._add_decode(engine)

    def _admit(self, request: SimRequest, prefill: PrefillEngine,  # type: ignore[override]
               decode: FluidDecodeEngine) -> None:
        super()._admit(request, prefill, decode)
        drains_at = max(self._drains_at[prefill.name], self.now) + request.prompt / prefill.tokens_per_s
        self._drains_at[prefill.name] = drains_at
        heapq.heappush(self._prefill_heap, (drains_at, prefill.name))
        heapq.heappush(self._decode_heap, (decode.load(), decode.name))

    def _start_step(self, engine: FluidDecodeEngine) -> None:  # type: ignore[override]
        """Settle the engine at `now` (steps done, sequences finished, waiting ones joined) and schedule
        its next finish."""
        engine.advance(self.now)
        if engine.finish_due(self.now):
            heapq.heappush(self._decode_heap, (engine.load(), engine.name))
        engine.fill(self.now)
        engine.version += 1
        done_at = engine.next_finish_s(self.now)
        if done_at is not None:
            self.events.push(done_at, EventKind.STEP_DONE, (engine, engine.version))

    def _prefill_valid(self, key: float, name: str) -> bool:
        return name in self._prefill_by_name and name not in self.draining and self._drains_at[name] == key

    def _decode_valid(self, key: int, name: str) -> bool:
        engine = self._decode_by_name.get(name)
        return engine is not None and name not in self.draining and engine.load() == key

    def _top(self, heap: list, valid: Callable[[object, str], bool]) -> str:
        while not valid(*heap[0]):
            heapq.heappop(heap)  # stale: its engine's load changed since, it drains, or it left
        return heap[0][1]


def simulate_fluid(workload: Sequence[RequestSpec], shape: FleetShape, duration_s: float, sample_every_s: float = 1.0,
                   horizon_s: float | None = None, control: Callable[[Fleet], None] | None = None) -> SimResult:
    """`simulate` with admission off (admit_all_policy) on the fluid fleet."""
    return run_fleet(FluidFleet(shape), workload, lambda fleet, _: fleet.least_loaded(), duration_s, sample_every_s,
                     horizon_s, control)

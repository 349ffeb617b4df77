"""A simulated P/D fleet: prefill and decode engines, and the events that move requests between them.

`FleetShape` is the configuration (plain data); `Fleet` is one run's state. The fleet does what the live
gateway and engines do after admission: queue the prompt on the chosen prefill engine, hand the prefilled
request to the chosen decode engine, step that engine's batch. A request whose prompt plus max_tokens
exceeds `max_model_len` is refused by the engine (as vLLM answers 400) and fails with that reason.

Role flips (a P:D rebalance, fleetctl/sim/pd_control.py): `start_flip` takes an engine out of the
admission snapshot, so nothing new is placed on it; once it is idle (its queue, batch and the requests
bound to it are done) it leaves, and `restart_s` later an engine of the other role joins (ENGINE_JOIN), as a
drained engine restarted in its new role does live.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetctl.gateway.admission import AdmissionRequest, ModelLoadSnapshot
from fleetctl.sim.engines import DecodeEngine, EngineConstants, PrefillEngine
from fleetctl.sim.events import EventKind, EventQueue
from fleetctl.sim.policies import Placement
from fleetctl.sim.requests import SimRequest
from fleetctl.sim.results import QueueSample
from fleetctl.sim.snapshot import fleet_snapshot


@dataclass(frozen=True)
class FleetShape:
    n_prefill: int  # prefill engines, named p0, p1, ...
    n_decode: int  # decode engines, named d0, d1, ...
    constants: EngineConstants  # every engine's speed
    max_num_seqs: int = 64  # decode slots per decode engine
    kv_capacity_tokens: int = 11_648  # KV pool per decode engine, in tokens
    max_model_len: int | None = None  # context window (prompt + max_tokens); None: unlimited

    def __post_init__(self) -> None:
        if self.n_prefill < 1 or self.n_decode < 1 or self.max_num_seqs < 1 or self.kv_capacity_tokens < 1:
            raise ValueError(f"a fleet needs at least one of each engine, slot and KV token: {self}")
        if self.constants.prefill_tokens_per_s <= 0 or self.constants.step_s(1) <= 0:
            raise ValueError(f"engine speeds must be positive: {self.constants}")


class Fleet:
    """One run's engines and clock; `simulate` feeds it arrivals and engine events."""

    def __init__(self, shape: FleetShape) -> None:
        self.shape = shape
        self.events = EventQueue()
        self.prefill: list[PrefillEngine] = []
        self.decode: list = []  # DecodeEngine, or the fluid model's FluidDecodeEngine
        self._prefill_by_name: dict[str, PrefillEngine] = {}
        self._decode_by_name: dict = {}
        for i in range(shape.n_prefill):
            self._add_prefill(PrefillEngine(f"p{i}", shape.constants.prefill_tokens_per_s))
        for i in range(shape.n_decode):
            self._add_decode(self._new_decode(f"d{i}"))
        self.draining: dict[str, tuple[str, float]] = {}  # engine -> (the role it restarts in, restart seconds)
        self.joining: list[str] = []  # roles of engines restarting after a flip
        self._next_index = {"prefill": shape.n_prefill, "decode": shape.n_decode}

    @property
    def now(self) -> float:
        return self.events.now

    def snapshot(self) -> ModelLoadSnapshot:
        if not self.draining:
            return fleet_snapshot(self.prefill, self.decode, self.now)
        return fleet_snapshot([e for e in self.prefill if e.name not in self.draining],
                              [e for e in self.decode if e.name not in self.draining], self.now)

    def start_flip(self, name: str, to_role: str, restart_s: float) -> None:
        """Drain engine `name`; once idle it leaves and, `restart_s` later, an engine of `to_role` joins."""
        if name not in self._prefill_by_name and name not in self._decode_by_name:
            raise KeyError(f"no engine {name!r}")
        self.draining[name] = (to_role, restart_s)
        engine = self._prefill_by_name.get(name) or self._decode_by_name[name]
        self._leave_if_drained(engine)

    def join(self, role: str) -> str:
        """An engine of `role` back from a flip (the ENGINE_JOIN event); its name."""
        self.joining.remove(role)
        index = self._next_index[role]
        self._next_index[role] += 1
        if role == "prefill":
            return self._add_prefill(PrefillEngine(f"p{index}", self.shape.constants.prefill_tokens_per_s))
        return self._add_decode(self._new_decode(f"d{index}"))

    def _new_decode(self, name: str) -> DecodeEngine:
        return DecodeEngine(name, self.shape.max_num_seqs, self.shape.kv_capacity_tokens, self.shape.constants)

    def _add_prefill(self, engine: PrefillEngine) -> str:
        self.prefill.append(engine)
        self._prefill_by_name[engine.name] = engine
        return engine.name

    def _add_decode(self, engine: DecodeEngine) -> str:
        self.decode.append(engine)
        self._decode_by_name[engine.name] = engine
        return engine.name

    def _leave_if_drained(self, engine: PrefillEngine | DecodeEngine) -> None:
        if engine.name not in self.draining or not engine.idle():
            return
        to_role, restart_s = self.draining.pop(engine.name)
        if isinstance(engine, PrefillEngine):
            self.prefill.remove(engine)
            del self._prefill_by_name[engine.name]
        else:
            self.decode.remove(engine)
            del self._decode_by_name[engine.name]
        self.joining.append(to_role)
        self.events.push(self.now + restart_s, EventKind.ENGINE_JOIN, to_role)

    def sample(self) -> QueueSample:
        return QueueSample(self.now, sum(e.length() for e in self.prefill), sum(len(e.waiting) for e in self.decode),
                           sum(len(e.running) for e in self.decode))

    def arrive(self, request: SimRequest, admission: AdmissionRequest, placement: Placement) -> None:
        request.decision = placement.decision
        if not placement.decision.admit:
            return
        assert placement.prefill_engine is not None and placement.decode_engine is not None
        request.prefill_engine, request.decode_engine = placement.prefill_engine, placement.decode_engine
        request.failure_reason = self._refusal(request, admission)
        if request.failure_reason is None:
            self._admit(request, self._prefill_by_name[request.prefill_engine], self._decode_by_name[request.decode_engine])

    def prefill_done(self, engine: PrefillEngine) -> None:
        request = engine.finish()
        assert request.decode_engine is not None
        decode = self._decode_by_name[request.decode_engine]
        del decode.bound[request.spec.request_id]
        decode.waiting.append(request)
        self._start_prefill(engine)
        self._start_step(decode)
        self._leave_if_drained(engine)

    def step_done(self, engine: DecodeEngine) -> None:
        engine.finish_step(self.now)
        self._start_step(engine)
        self._leave_if_drained(engine)

    def preemptions(self) -> int:
        return sum(e.preemptions for e in self.decode)

    def _refusal(self, request: SimRequest, admission: AdmissionRequest) -> str | None:
        limit = self.shape.max_model_len
        wanted = admission.num_prompt_tokens + admission.max_tokens
        if limit is not None and wanted > limit:
            return (f"{request.prefill_engine} refused it: prompt {admission.num_prompt_tokens} + max_tokens "
                    f"{admission.max_tokens} > max_model_len {limit}")
        return None

    def _admit(self, request: SimRequest, prefill: PrefillEngine, decode: DecodeEngine) -> None:
        decode.bound[request.spec.request_id] = request
        prefill.queue.append(request)
        self._start_prefill(prefill)

    def _start_prefill(self, engine: PrefillEngine) -> None:
        done_at = engine.start_next(self.now)
        if done_at is not None:
            self.events.push(done_at, EventKind.PREFILL_DONE, engine)

    def _start_step(self, engine: DecodeEngine) -> None:
        done_at = engine.start_step(self.now)
        if done_at is not None:
            self.events.push(done_at, EventKind.STEP_DONE, engine)

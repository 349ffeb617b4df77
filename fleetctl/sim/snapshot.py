"""The simulated fleet as the gateway's admission sees it: a `ModelLoadSnapshot` of `EngineLoad`s.

Fields are filled as `fleetctl.gateway.admission.EngineLoad` defines them, so the decision functions get
what they would get live:
- a prefill engine: its queued prompt tokens (the one in service counts what is left) and its queue length
  as `admitted_ahead`;
- a decode engine: its running sequences (remaining tokens up to max_tokens, KV held), the requests admitted
  to it that have not started decoding (in prefill or waiting) as `admitted_ahead` and their prompts as
  `queued_prefill_tokens`, its KV headroom, and its current step time.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl.gateway.admission import EngineLoad, ModelLoadSnapshot, RunningDecode
from fleetctl.sim.engines import DecodeEngine, PrefillEngine


def fleet_snapshot(prefill: Sequence[PrefillEngine], decode: Sequence[DecodeEngine], now: float) -> ModelLoadSnapshot:
    loads = [prefill_load(e, now) for e in prefill] + [decode_load(e) for e in decode]
    return ModelLoadSnapshot(tuple(loads))


def prefill_load(engine: PrefillEngine, now: float) -> EngineLoad:
    return EngineLoad(engine_id=engine.name, role="prefill", queued_prefill_tokens=engine.queued_tokens(now),
                      prefill_tokens_per_s=engine.tokens_per_s, admitted_ahead=engine.length())


def decode_load(engine: DecodeEngine) -> EngineLoad:
    ahead = engine.admitted_ahead()
    return EngineLoad(
        engine_id=engine.name,
        role="decode",
        queued_prefill_tokens=sum(r.prompt for r in ahead),
        prefill_tokens_per_s=engine.constants.prefill_tokens_per_s,
        admitted_ahead=len(ahead),
        running=tuple(RunningDecode(max(0, r.max_tokens - r.generated), r.prompt + r.generated) for r in engine.running),
        max_num_seqs=engine.slots,
        decode_step_s=engine.constants.step_s(max(1, len(engine.running))),
        kv_headroom_tokens=engine.kv_capacity - engine.kv_used(),
    )

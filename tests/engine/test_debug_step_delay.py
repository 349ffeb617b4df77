"""The test-only `debug_step_delay_ms`: every step that computes tokens waits that long, and the tokens are
the ones the same engine gives without it. Time is a fake clock the engine's injected sleep advances."""

from __future__ import annotations

import pytest

from engine.process_settings import SettingsError
from engine.reference.cli_args import build_parser, config_from_args
from engine.reference.config import EngineConfig
from engine.reference.llm_engine import LLMEngine
from engine.contract.sampling_params import SamplingParams

PROMPTS = {"a": [101, 2020, 303, 4040, 505, 6060, 707], "b": list(range(500, 540))}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def generate(engine: LLMEngine, clock: FakeClock) -> tuple[dict[str, list[int]], list[float]]:
    """Greedy tokens per request, and the fake time each step took."""
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for rid, prompt in PROMPTS.items():
        engine.add_request(rid, prompt, params)
    tokens: dict[str, list[int]] = {rid: [] for rid in PROMPTS}
    step_times = []
    while engine.has_work():
        before = clock.now
        for output in engine.step().outputs:
            tokens[output.request_id] += output.new_token_ids
        step_times.append(clock.now - before)
    return tokens, step_times


def engine(clock: FakeClock, delay_ms: int) -> LLMEngine:
    config = EngineConfig(model="tiny", kv_cache_mib=8, max_num_batched_tokens=16, debug_step_delay_ms=delay_ms)
    return LLMEngine(config, sleep=clock.sleep)


def test_every_step_takes_the_delay_and_tokens_do_not_change():
    plain_clock, slow_clock = FakeClock(), FakeClock()
    plain, _ = generate(engine(plain_clock, 0), plain_clock)
    slow, step_times = generate(engine(slow_clock, 40), slow_clock)
    assert slow == plain
    assert all(len(t) == 6 for t in slow.values())
    assert plain_clock.sleeps == []
    assert len(step_times) > 6  # chunked prefill of "b" over several steps, then decodes
    assert slow_clock.sleeps == [0.040] * len(step_times)  # one wait per step
    assert min(step_times) == pytest.approx(0.040)  # the fake clock moves only when the engine sleeps


def test_an_idle_step_does_not_wait():
    clock = FakeClock()
    engine(clock, 40).step()
    assert clock.sleeps == []


def test_the_flag_sets_the_field_and_refuses_a_negative_delay():
    args = build_parser().parse_args(["--model", "tiny", "--debug-step-delay-ms", "40"])
    assert config_from_args(args).debug_step_delay_ms == 40
    with pytest.raises(SettingsError, match="debug_step_delay_ms"):
        config_from_args(build_parser().parse_args(["--debug-step-delay-ms", "-1"]))

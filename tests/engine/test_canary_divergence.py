"""Each misconfiguration the quality canary must catch changes the tiny model's answers, and nothing else
does: compared with a clean engine of the same seed on a fixed set of prompts (short and long, greedy, 16
tokens), in process.

A prompt diverges when its greedy tokens differ, or when, over the tokens that still match, the logprob of a
chosen token differs by more than LOGPROB_TOLERANCE. Measured on this set (tiny model, seed 0):
- token flips: rope_scaling=4 (a long-context build) and rope_perturb 11/12 (12/12 diverged);
  approximate_topk with the prompts as one concurrent batch of 12 10/12, its planted fault the same;
  float16 and bfloat16 KV (and the faults kv_fp16, kv_bf16) 0/12;
- logprob distance: float16 KV 4.9e-4 .. 2.3e-3, bfloat16 KV 5.8e-3 .. 1.5e-2, on every prompt, while the
  clean engine against itself at batch 4, 8 and 12 differs by at most 7.2e-6 (batched matmuls round
  differently) and never in a token; approximate_topk alone is exact (identical tokens and logprobs).
A reduced-precision KV cache perturbs float32 attention by a relative 2^-11 (float16) or 2^-8 (bfloat16):
it moves logits by ~1e-3 .. 1e-2 but seldom reorders the top two (their gap is ~0.1 .. 3), here and on
SmolLM2 alike (0/12 and 1/12 token flips at 16 tokens), so the canary sees it in the logprob distance.
The thresholds below sit well inside the measured rates."""

from __future__ import annotations

import pytest

from engine.contract.faults import FAULT_ENV, FAULTS
from engine.contract.prometheus import parse_samples
from engine.contract.sampling_params import SamplingParams
from engine.reference.config import EngineConfig
from engine.reference.llm_engine import LLMEngine

MAX_TOKENS = 16
LOGPROB_TOLERANCE = 1e-4  # 14x the clean engine's batch noise, 5x below float16 KV's smallest effect
WORDS = "river stone cloud maple lantern copper violet harbor meadow thunder quiet orbit".split()
PROMPT_WORDS = (4, 8, 12, 20, 40, 60, 90, 120, 160, 200, 250, 300)  # 4 .. 301 tokens

Answer = list[tuple[int, float]]  # (token id, its logprob) per generated token


def prompt_text(i: int, n_words: int) -> str:
    return " ".join(WORDS[(i * 7 + k * (i + 3)) % len(WORDS)] for k in range(n_words))


def make_engine(fault: str | None = None, **overrides) -> LLMEngine:
    return LLMEngine(EngineConfig(model="tiny", seed=0, kv_cache_mib=16, num_threads=1, **overrides), fault=fault)


def answers(engine: LLMEngine, prompts: list[list[int]], batch: int) -> list[Answer]:
    """Greedy answers, `batch` prompts at a time added together (so they run as one concurrent batch)."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, logprobs=1)
    got: dict[int, Answer] = {i: [] for i in range(len(prompts))}
    for start in range(0, len(prompts), batch):
        for i in range(start, min(start + batch, len(prompts))):
            engine.add_request(str(i), prompts[i], params)
        while engine.has_work():
            for out in engine.step().outputs:
                got[int(out.request_id)] += [(lp.token_id, lp.logprob) for lp in out.new_logprobs or []]
    return [got[i] for i in range(len(prompts))]


def token_flips(reference: list[Answer], observed: list[Answer]) -> float:
    return sum(_tokens(a) != _tokens(b) for a, b in zip(reference, observed)) / len(reference)


def logprob_distance(reference: Answer, observed: Answer) -> float:
    """The largest logprob difference over the matching prefix of two answers."""
    distance = 0.0
    for (tok_a, lp_a), (tok_b, lp_b) in zip(reference, observed):
        if tok_a != tok_b:
            break
        distance = max(distance, abs(lp_a - lp_b))
    return distance


def diverged(reference: list[Answer], observed: list[Answer]) -> float:
    """The fraction of prompts whose tokens, or logprobs beyond LOGPROB_TOLERANCE, differ."""
    return sum(_tokens(a) != _tokens(b) or logprob_distance(a, b) > LOGPROB_TOLERANCE
               for a, b in zip(reference, observed)) / len(reference)


def _tokens(answer: Answer) -> list[int]:
    return [tok for tok, _ in answer]


@pytest.fixture(scope="module")
def clean() -> LLMEngine:
    return make_engine()


@pytest.fixture(scope="module")
def prompts(clean: LLMEngine) -> list[list[int]]:
    return [clean.tokenizer.encode(prompt_text(i, n)) for i, n in enumerate(PROMPT_WORDS)]


@pytest.fixture(scope="module")
def alone(clean: LLMEngine, prompts: list[list[int]]) -> list[Answer]:
    return answers(clean, prompts, batch=1)


@pytest.fixture(scope="module")
def together(clean: LLMEngine, prompts: list[list[int]]) -> list[Answer]:
    return answers(clean, prompts, batch=len(prompts))


def test_the_prompts_are_short_and_long(prompts: list[list[int]]) -> None:
    assert min(map(len, prompts)) <= 8 and max(map(len, prompts)) >= 300


@pytest.mark.parametrize("batch", [4, 8, len(PROMPT_WORDS)])
def test_the_clean_engine_agrees_with_itself_at_every_batch_size(clean, prompts, alone, batch: int) -> None:
    observed = answers(clean, prompts, batch)
    assert token_flips(alone, observed) == 0
    assert diverged(alone, observed) == 0


def test_approximate_topk_alone_is_exact(prompts, alone) -> None:
    observed = answers(make_engine(sampler="approximate_topk"), prompts, batch=1)
    assert observed == alone


# (engine settings, planted fault, prompts run as one batch, least fraction of token flips, least fraction diverged)
CASES = {
    "rope_scaling=4": ({"rope_scaling": 4.0}, None, False, 0.75, 0.75),
    "kv_cache_dtype=float16": ({"kv_cache_dtype": "float16"}, None, False, 0.0, 0.9),
    "kv_cache_dtype=bfloat16": ({"kv_cache_dtype": "bfloat16"}, None, False, 0.0, 0.9),
    "approximate_topk at batch 12": ({"sampler": "approximate_topk"}, None, True, 0.6, 0.6),
    "fault kv_fp16": ({}, "kv_fp16", False, 0.0, 0.9),
    "fault kv_bf16": ({}, "kv_bf16", False, 0.0, 0.9),
    "fault approx_topk at batch 12": ({}, "approx_topk", True, 0.6, 0.6),
    "fault rope_perturb": ({}, "rope_perturb", False, 0.75, 0.75),
}


def test_every_planted_fault_has_a_case() -> None:
    assert {fault for _, fault, _, _, _ in CASES.values() if fault} == set(FAULTS)


@pytest.mark.parametrize("case", CASES)
def test_a_misconfiguration_changes_answers(clean, prompts, alone, together, case: str) -> None:
    overrides, fault, batched, least_flips, least_diverged = CASES[case]
    engine = make_engine(fault, **overrides)
    observed = answers(engine, prompts, batch=len(prompts) if batched else 1)
    reference = together if batched else alone
    assert token_flips(reference, observed) >= least_flips
    assert diverged(reference, observed) >= least_diverged
    if fault is not None:  # what the engine reports stays as configured, the pool's size included
        assert engine.config.model_dump(exclude={"engine_id"}) == clean.config.model_dump(exclude={"engine_id"})
        assert engine.runner.num_blocks == clean.runner.num_blocks


# --- through the environment, on real processes --------------------------------------------------------


PROCESS_PROMPTS = [prompt_text(i, n) for i, n in enumerate((6, 30, 80))]


def _completions(engine) -> list[Answer]:
    got = []
    for prompt in PROCESS_PROMPTS:
        r = engine.post("/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS,
                                            "temperature": 0, "ignore_eos": True, "logprobs": 1,
                                            "return_tokens_as_token_ids": True})
        assert r.status_code == 200, r.text
        lp = r.json()["choices"][0]["logprobs"]
        got.append(list(zip(lp["tokens"], lp["token_logprobs"])))
    return got


def _reported(engine) -> dict:
    """What an operator or the controller sees of the engine's configuration."""
    models = engine.get("/v1/models").json()
    for card in models["data"]:
        card.pop("created")
    (cache_info,) = parse_samples(engine.get("/metrics").text)["vllm:cache_config_info"]
    return {"config": engine.get("/v1/fleet/config").json(), "models": models, "cache_config_info": cache_info.labels}


@pytest.fixture(scope="module")
def clean_process(launch_engine):
    return launch_engine()


@pytest.mark.parametrize("fault", ["rope_perturb", "kv_bf16"])
def test_a_planted_fault_from_the_environment_changes_answers_not_the_reported_config(
        launch_engine, clean_process, fault: str) -> None:
    faulty = launch_engine(env={FAULT_ENV: fault})
    assert _reported(faulty) == _reported(clean_process)
    reference, observed = _completions(clean_process), _completions(faulty)
    assert diverged(reference, observed) == 1.0
    warnings = [line for line in faulty.log_path.read_text().splitlines() if " WARNING " in line and fault in line]
    assert len(warnings) == 1 and "PLANTED FAULT" in warnings[0]

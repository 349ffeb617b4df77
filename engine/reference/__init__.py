"""The reference engine: a vLLM-like engine in plain torch that runs a real model on CPU.

Layers (each a module, each small):
- `sampling_params`, `sequence`: plain data about one request.
- `block_manager`: the paged KV pool's bookkeeping: block tables, ref counts, prefix cache by hash, LRU eviction.
- `scheduler`: iteration-level continuous batching with chunked prefill and preemption. No torch.
- `weights`, `model`, `model_runner`, `sampler`: torch. Load weights, run one batched forward over the paged
  KV pool, sample.
- `llm_engine`: one `step()` = schedule, execute, sample, update; `async_engine` runs it on a thread.
- `server`: the OpenAI-compatible HTTP API, `/metrics` (vLLM names), KV events, P/D KV transfer.
"""

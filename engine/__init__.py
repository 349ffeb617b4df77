"""The engine contract shared by every part of fleetctl, and the engines themselves.

Modules at this level never import torch: the gateway, the controller and the simulator import them.
- `hashing`: the one prefix-block hash function (vLLM v1 `sha256_cbor` scheme).
- `kv_events`: BlockStored / BlockRemoved / AllBlocksCleared and their ZMQ/msgpack wire form.
- `metric_names`: vLLM v1 Prometheus metric names, labels and buckets.
- `protocol`: OpenAI-compatible request types with validation that names the bad field.
- `errors`: the engine error family, each mapped to one HTTP status.
Engines live in `engine.reference` (torch, CPU or GPU) and `engine.vllm` (renders `vllm serve`).
"""

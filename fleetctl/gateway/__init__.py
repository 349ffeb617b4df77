"""The gateway: OpenAI-compatible front door, router and admission for a model's engines.

Decision layer (pure functions over snapshots, shared by the live gateway and the simulator):
- `prefix_index`: block hash -> engines holding it, fed by KV events; `longest_prefix` per engine.
- `scorer`: `rank_engines`, one score combining prefix locality and load, with a hot-spot guard.
- `class_choice`: `choose_class` (traffic weights, pins) and `fits` (context window guard).
- `admission`: admit on PREDICTED load (TTFT and decode slots when the request gets there), plus the
  observed-load baseline.
I/O around it:
- `kv_subscriber`: ZMQ SUB + replay client per engine, keeping the prefix index current.
"""

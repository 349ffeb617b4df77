"""The gateway: OpenAI-compatible front door, router and admission for a model's engines (docs/gateway.md).

Decision layer (pure functions over snapshots, shared by the live gateway and the simulator):
- `prefix_index`: block hash -> engines holding it, fed by KV events; `longest_prefix` per engine.
- `scorer`: `rank_engines`, one score combining prefix locality and load, with a hot-spot guard.
- `class_choice`: `choose_class` (traffic weights, pins) and `fits` (context window guard).
- `admission`: admit on PREDICTED load (TTFT and decode slots when the request gets there), plus the
  observed-load baseline.
- `router`: P/D or whole-request, the ranked engines of each stage, and admission, for one request.
I/O around it:
- `kv_subscriber`: ZMQ SUB + replay client per engine, keeping the prefix index current.
- `routing_table` (controller) / `static_table` (`--engines`): the table, cached; `table_reporter`.
- `probes`, `engine_metrics`, `engine_state`, `traffic`, `snapshot`: live engine views -> snapshots.
- `service`: gathers the snapshots and prepares a request's plan; `tokenization`, `requests`.
- `dispatch` (retries), `pd` (handoff), `relay` (SSE), `upstream` (engine HTTP): acting on the plan.
- `frontdoor`, `explain`, `app`, `server`, `metrics`, `api_keys`, `settings`: the HTTP service.
"""

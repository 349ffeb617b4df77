"""The contract between engines, agents, the controller and the gateway: the types and words they exchange.

No module here imports torch, or anything of `agent` or `fleetctl`; every process may import this package.
- `bounds`: bounded integers, finite floats and storable strings, used by every wire model.
- `engine_state`: `Role`, `EngineState` and the state sets (`RUNNING_STATES`, `FINISHED_STATES`).
- `fields`: the bounded strings that name an engine (engine, model, class ref, endpoints), column-wide.
- `assignment`: `EngineAssignment`, one engine the controller wants on a node (the heartbeat reply).
- `observed`: `EngineObserved` and `EngineMetrics`, one engine as it runs (the heartbeat).
- `launched`: `LaunchedCommand` and `ReportedConfig`, what an engine really runs (redacted, bounded).
- `reference_models`: the reference engine's model names and its on-disk cache location.
- `engine_version`: the reference engine's own version (its package's), which a replica class may pin.
- `prometheus`: the one reader of Prometheus' text exposition (a line scan).
- `sampling_params`, `outputs`: what a request asks of an engine's sampler and what it streams back (plain
  data: the OpenAI protocol maps requests onto them; the reference engine runs on them).
"""

from engine.contract.assignment import EngineAssignment
from engine.contract.engine_state import ENGINE_STATES, FINISHED_STATES, ROLES, RUNNING_STATES, EngineState, Role
from engine.contract.engine_version import reference_engine_version
from engine.contract.launched import LaunchedCommand, ReportedConfig
from engine.contract.observed import EngineMetrics, EngineObserved
from engine.contract.prometheus import Sample, parse_labels, parse_samples, sample_lines, sum_series
from engine.contract.reference_models import REFERENCE_MODELS, default_cache_dir, smollm2_cache_dir

__all__ = [
    "ENGINE_STATES", "FINISHED_STATES", "REFERENCE_MODELS", "ROLES", "RUNNING_STATES",
    "EngineAssignment", "EngineMetrics", "EngineObserved", "EngineState", "LaunchedCommand", "ReportedConfig",
    "Role", "Sample", "default_cache_dir", "parse_labels", "parse_samples", "reference_engine_version",
    "sample_lines", "smollm2_cache_dir", "sum_series",
]

"""The fleet simulator: a discrete-event model of a P/D inference fleet, driven by the gateway's own
admission functions (`fleetctl.gateway.admission`), so what it predicts is what the live gateway decides.

Modules, by concept:
- `events`: the clock, a time-ordered event queue with deterministic ties.
- `requests`: `RequestSpec` (what the workload offers) and `SimRequest` (its state during a run).
- `engines`: `EngineConstants` and the prefill / decode engine model (batching, KV, preemption).
- `snapshot`: the simulated fleet as `admission.ModelLoadSnapshot`.
- `policies`: admission policies as pure functions (predicted, observed-load baseline, admit-all).
- `fleet`: `FleetShape` and the fleet that moves requests between engines.
- `simulation`: `simulate(workload, shape, policy, duration_s)` -> `SimResult`.
- `results`: `SimResult`, `RequestResult` (how each request ended, and why), `QueueSample`.
- `workload`: workloads from the traces in ../shared/traces, as they happened or resampled with a seed.
- `sizing`: engine counts for a chosen overload of a workload.

Torch-free and HTTP-free: it imports the gateway's pure decision modules and nothing of the controller.
"""

from fleetctl.sim.engines import REFERENCE_SMOLLM2_CPU, EngineConstants
from fleetctl.sim.fleet import FleetShape
from fleetctl.sim.policies import Placement, Policy, admit_all_policy, observed_policy, predicted_policy
from fleetctl.sim.requests import RequestSpec
from fleetctl.sim.results import Outcome, QueueSample, RequestResult, SimResult
from fleetctl.sim.simulation import simulate
from fleetctl.sim.sizing import FleetSizing, size_for_overload
from fleetctl.sim.workload import LengthScaling, TraceRow, load_azure_trace, sampled_workload, trace_slice

__all__ = [
    "REFERENCE_SMOLLM2_CPU",
    "EngineConstants",
    "FleetShape",
    "FleetSizing",
    "LengthScaling",
    "Outcome",
    "Placement",
    "Policy",
    "QueueSample",
    "RequestResult",
    "RequestSpec",
    "SimResult",
    "TraceRow",
    "admit_all_policy",
    "load_azure_trace",
    "observed_policy",
    "predicted_policy",
    "sampled_workload",
    "simulate",
    "size_for_overload",
    "trace_slice",
]

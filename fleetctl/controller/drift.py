"""Live config drift: what a running engine really runs against the class revision it was started for.

The truth comes from the engine side, never from the controller's own records. Two sources, as the agent
reports them in its heartbeat (engine.contract.launched):
  - "launch": the command line the agent launched the engine with (`LaunchedCommand.argv`). Each class field
    that becomes a flag is read back from it (the last occurrence wins, as argparse reads it), each
    `engine_args` entry must be there with its value, and a flag the class did not render is a difference;
  - "engine": the engine's own account of its settings (`ReportedConfig`): the reference engine's effective
    EngineConfig, or vLLM's `cache_config_info` labels and `/v1/models` card. And its version, when the class
    declares one (`engine_version`).

`config_drift(spec, launched, reported)` is a pure function; `drifted_engines(session, model)` and
`engine_drift(session, model)` read the running engines and their class revisions and call it.

Values are compared in the form the backend runs them, which is the form shown: a KV dtype of "auto" is
the model's dtype (the reference engine reports the resolved dtype; vLLM keeps "auto" for "the same as
dtype"), and the reference engine computes in float32 when the class says dtype "auto".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from engine.contract import RUNNING_STATES, LaunchedCommand, ReportedConfig
from engine.contract.launch_flags import RENDERED_FLAGS
from fleetctl.controller.models import ClassRevision, Engine
from fleetctl.replica_class import ReplicaClassSpec

Source = Literal["engine", "launch"]
ENGINE: Source = "engine"
LAUNCH: Source = "launch"
_ABSENT = object()


@dataclass(frozen=True)
class Drift:
    """One difference: the class field (or `engine_args.KEY`, or `argv.--FLAG` for a flag no class field or
    engine_args entry rendered), what the class declares, what the engine runs, and which source says so."""

    field: str
    declared: Any
    actual: Any
    source: Source

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- reading a command line ---

@dataclass(frozen=True)
class ParsedArgv:
    positional: tuple[str, ...]  # the program and its positional arguments (`vllm serve MODEL`)
    flags: Mapping[str, str | bool]  # without dashes; a switch is True, `--no-x` is x: False; the last wins


def parse_argv(argv: Sequence[str]) -> ParsedArgv:
    positional: list[str] = []
    flags: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            positional.append(arg)
            i += 1
            continue
        name, has_value, value = arg[2:].partition("=")
        if has_value:
            flags[name] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[name] = argv[i + 1]
            i += 1
        elif name.startswith("no-"):
            flags[name[3:]] = False
        else:
            flags[name] = True
        i += 1
    return ParsedArgv(tuple(positional), flags)


# --- how each class field is run ---

INT_FIELDS = frozenset({"max_model_len", "block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_mib",
                        "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"})
FLOAT_FIELDS = frozenset({"rope_scaling", "gpu_memory_utilization"})
BOOL_FIELDS = frozenset({"enable_prefix_caching", "enable_chunked_prefill"})

# class field -> the flag it becomes, per backend (vLLM's weights are its positional MODEL instead).
_COMMON_FLAGS = {"model": "served-model-name", "dtype": "dtype", "kv_cache_dtype": "kv-cache-dtype",
                 "max_model_len": "max-model-len", "block_size": "block-size", "max_num_seqs": "max-num-seqs",
                 "max_num_batched_tokens": "max-num-batched-tokens", "enable_prefix_caching": "enable-prefix-caching",
                 "enable_chunked_prefill": "enable-chunked-prefill"}
LAUNCH_FLAGS: dict[str, dict[str, str]] = {
    "reference": {**_COMMON_FLAGS, "weights": "model", "kv_cache_mib": "kv-cache-mib", "rope_scaling": "rope-scaling",
                  "sampler": "sampler"},
    "vllm": {**_COMMON_FLAGS, "weights_revision": "revision", "tokenizer": "tokenizer",
             "gpu_memory_utilization": "gpu-memory-utilization", "tensor_parallel_size": "tensor-parallel-size",
             "pipeline_parallel_size": "pipeline-parallel-size", "data_parallel_size": "data-parallel-size"},
}
# What a flag that is not on the command line means (the renderer leaves it out for this value).
ABSENT_MEANS: dict[str, dict[str, Any]] = {
    "reference": {"enable_prefix_caching": True, "enable_chunked_prefill": True, "rope_scaling": None},
    "vllm": {"weights_revision": "main", "tokenizer": None},
}
# class field -> the key of the engine's reported settings that holds it.
REPORTED_KEYS: dict[str, dict[str, str]] = {
    "reference": {"model": "served_model_name", "weights": "model", "dtype": "dtype", "kv_cache_dtype": "kv_cache_dtype",
                  "max_model_len": "max_model_len", "block_size": "block_size", "max_num_seqs": "max_num_seqs",
                  "max_num_batched_tokens": "max_num_batched_tokens", "kv_cache_mib": "kv_cache_mib",
                  "rope_scaling": "rope_scaling", "sampler": "sampler",
                  "enable_prefix_caching": "enable_prefix_caching", "enable_chunked_prefill": "enable_chunked_prefill"},
    "vllm": {"weights": "root", "kv_cache_dtype": "cache_dtype", "block_size": "block_size",
             "enable_prefix_caching": "enable_prefix_caching", "gpu_memory_utilization": "gpu_memory_utilization",
             "max_model_len": "max_model_len"},
}


def as_field(name: str, value: Any) -> Any:
    """`value` (a flag's text, a label's string, a reported number) in the type of class field `name`; a value
    that does not read as that type is kept as it is (it then differs)."""
    if value is None or name not in INT_FIELDS | FLOAT_FIELDS | BOOL_FIELDS:
        return value if value is None or isinstance(value, (bool, int, float)) else str(value)
    try:
        if name in BOOL_FIELDS:
            return value if isinstance(value, bool) else {"true": True, "false": False}[str(value).lower()]
        return int(value) if name in INT_FIELDS else float(value)
    except (KeyError, TypeError, ValueError):
        return value


def run_dtype(backend: str, dtype: Any) -> Any:
    # The reference engine computes in float32 when told "auto" (agent/launch.py renders it so).
    return "float32" if backend == "reference" and dtype == "auto" else dtype


def run_kv_dtype(backend: str, kv_dtype: Any, dtype: Any) -> Any:
    """The KV dtype in the form the backend reports it: the reference engine resolves "auto" to the dtype;
    vLLM keeps "auto" for "the same as the dtype" (and is launched with "auto" when the two are equal)."""
    if backend == "reference":
        return dtype if kv_dtype == "auto" else kv_dtype
    return "auto" if kv_dtype in ("auto", dtype) else kv_dtype


def declared_value(spec: ReplicaClassSpec, name: str) -> Any:
    value = getattr(spec, name)
    if name == "dtype":
        return run_dtype(spec.backend, value)
    if name == "kv_cache_dtype":
        return run_kv_dtype(spec.backend, value, run_dtype(spec.backend, spec.dtype))
    return as_field(name, value)


# --- the differences ---

def config_drift(spec: ReplicaClassSpec, launched: LaunchedCommand | None,
                 reported: ReportedConfig | None) -> list[Drift]:
    """Every difference between `spec` and what runs, engine-reported first; [] when nothing differs or
    neither source is known."""
    return engine_drift_of(spec, reported) + launch_drift(spec, launched)


def launch_drift(spec: ReplicaClassSpec, launched: LaunchedCommand | None) -> list[Drift]:
    if launched is None or not launched.argv:
        return []
    parsed = parse_argv(launched.argv)
    actual = launched_values(spec.backend, parsed)
    drifts = _compare(spec, actual, LAUNCH)
    drifts += _engine_args_drift(spec, parsed)
    drifts += _undeclared_flags(spec, parsed)
    return drifts


def launched_values(backend: str, parsed: ParsedArgv) -> dict[str, Any]:
    """Class field -> its value as the command line runs it (fields it does not say are left out)."""
    values: dict[str, Any] = {}
    absent = ABSENT_MEANS.get(backend, {})
    for name, flag in LAUNCH_FLAGS.get(backend, {}).items():
        value = parsed.flags.get(flag, absent.get(name, _ABSENT))
        if value is not _ABSENT:
            values[name] = as_field(name, value)
    if backend == "vllm" and len(parsed.positional) >= 3 and parsed.positional[1] == "serve":
        values["weights"] = parsed.positional[2]
    if "dtype" in values:
        values["dtype"] = run_dtype(backend, values["dtype"])
    if "kv_cache_dtype" in values:
        values["kv_cache_dtype"] = run_kv_dtype(backend, values["kv_cache_dtype"], values.get("dtype", "float32"))
    return values


def _engine_args_drift(spec: ReplicaClassSpec, parsed: ParsedArgv) -> list[Drift]:
    drifts = []
    for key, value in spec.engine_args.items():
        actual = parsed.flags.get(flag_of(key))
        declared = value if isinstance(value, bool) else str(value)
        if actual != declared:
            drifts.append(Drift(f"engine_args.{key}", value, actual, LAUNCH))
    return drifts


def _undeclared_flags(spec: ReplicaClassSpec, parsed: ParsedArgv) -> list[Drift]:
    """Flags on the command line that neither a class field nor an engine_args entry rendered."""
    known = RENDERED_FLAGS.get(spec.backend, frozenset()) | {flag_of(key) for key in spec.engine_args}
    return [Drift(f"argv.--{name}", None, value, LAUNCH) for name, value in parsed.flags.items() if name not in known]


def flag_of(engine_arg: str) -> str:
    """An engine_args key as the flag it renders (engine.vllm.render_flags: dashes, no leading ones)."""
    return str(engine_arg).lstrip("-").replace("_", "-")


def engine_drift_of(spec: ReplicaClassSpec, reported: ReportedConfig | None) -> list[Drift]:
    if reported is None or reported.source != spec.backend:
        return []
    actual = {name: as_field(name, reported.settings[key])
              for name, key in REPORTED_KEYS.get(spec.backend, {}).items() if key in reported.settings}
    drifts = _compare(spec, actual, ENGINE)
    declared_version = getattr(spec, "engine_version", None)  # a class may pin the engine's version
    if declared_version is not None and reported.version is not None and reported.version != declared_version:
        drifts.append(Drift("engine_version", declared_version, reported.version, ENGINE))
    return drifts


def _compare(spec: ReplicaClassSpec, actual: Mapping[str, Any], source: Source) -> list[Drift]:
    drifts = []
    for name in ReplicaClassSpec.model_fields:  # in the class's field order
        if name in actual and (declared := declared_value(spec, name)) != actual[name]:
            drifts.append(Drift(name, declared, actual[name], source))
    return drifts


# --- over the store ---

@dataclass(frozen=True)
class EngineDrift:
    """One running engine and its differences from its class revision."""

    name: str
    node: str
    model: str
    class_ref: str
    state: str
    checked: tuple[Source, ...]  # the sources that were known: nothing to compare is not "no drift"
    drift: tuple[Drift, ...]

    @property
    def drifted(self) -> bool:
        return bool(self.drift)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "node": self.node, "model": self.model, "class_ref": self.class_ref,
                "state": self.state, "drifted": self.drifted, "checked": list(self.checked),
                "drift": [d.as_dict() for d in self.drift]}


def engine_drift(session: Session, model: str | None = None) -> list[EngineDrift]:
    """Every running engine (of `model`, if given) whose class revision is known, by name then node."""
    query = select(Engine).where(Engine.state.in_(sorted(RUNNING_STATES))).order_by(Engine.name, Engine.node)
    if model is not None:
        query = query.where(Engine.model == model)
    rows = list(session.execute(query).scalars())
    specs = class_specs(session, {row.class_ref for row in rows})
    return [drift_of_row(row, specs[row.class_ref]) for row in rows if row.class_ref in specs]


def drifted_engines(session: Session, model: str | None = None) -> dict[str, tuple[str, ...]]:
    """class_ref -> the names of its running engines whose config differs from it (classes without a
    drifted engine are left out). For gates that must not send traffic to a drifted engine."""
    found: dict[str, list[str]] = {}
    for engine in engine_drift(session, model):
        if engine.drifted:
            found.setdefault(engine.class_ref, []).append(engine.name)
    return {ref: tuple(names) for ref, names in found.items()}


def class_specs(session: Session, refs: set[str]) -> dict[str, ReplicaClassSpec]:
    """The specs of these class revisions (one query); a stored spec is valid by construction."""
    if not refs:
        return {}
    rows = session.execute(select(ClassRevision.ref, ClassRevision.spec).where(ClassRevision.ref.in_(sorted(refs))))
    return {row.ref: ReplicaClassSpec.model_validate(row.spec) for row in rows}


def drift_of_row(row: Engine, spec: ReplicaClassSpec) -> EngineDrift:
    launched = _parsed(LaunchedCommand.model_validate, row.launched)
    reported = _parsed(ReportedConfig.model_validate, row.reported)
    checked = tuple(source for source, known in ((ENGINE, reported), (LAUNCH, launched)) if known is not None)
    return EngineDrift(row.name, row.node, row.model, row.class_ref, row.state, checked,
                       tuple(config_drift(spec, launched, reported)))


def _parsed(parse: Callable[[Any], Any], value: Any) -> Any:
    """A stored JSON column as its contract model; None when absent (an older agent) or unreadable."""
    if value is None:
        return None
    try:
        return parse(value)
    except ValidationError:
        return None

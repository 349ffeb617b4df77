"""`fleetctl canary record|references|golden check`: golden sets and the references probes are judged against.

    fleetctl canary record --class NAME@rN --golden FILE [--gateway URL] [--repetitions N] [-o json]
    fleetctl canary references [MODEL] [-o table|json|yaml]
    fleetctl canary golden check FILE [-o table|json|yaml]

`record` records a reference from a known-good class revision through the real serving path: it reads the
revision from the controller, loads and validates the golden set (FILE, or the name of a shipped set:
`smollm2`, `tiny`), counts each prompt's tokens with the gateway (its route explanation, pinned to the
revision: the count the serving path makes, chat template included) and checks the set against the class
(its model, its context window). Only then does it store the golden set, send each prompt `--repetitions`
times at every batch condition pinned to the revision, walking its ready engines (progress on stderr), and
store the reference. A bad file is one line naming the entry and exit 2, with nothing stored.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from fleetctl.canary.golden import (
    GoldenSetError, check_against_class, check_model, golden_digest, load_golden, shipped_golden,
)
from fleetctl.canary.noise import stream_p0, upper_bound
from fleetctl.canary.probe_client import ProbeError, prompt_token_count, send_probe
from fleetctl.canary.record import record_reference
from fleetctl.canary.types import BATCH_CONDITIONS, GoldenPrompt, GoldenSet, ProbeOutput, Reference
from fleetctl.cli.canary_app import app
from fleetctl.cli.context import ReasonOption, client
from fleetctl.cli.gateway_cmd import DEFAULT_GATEWAY, GATEWAY_ENV, GATEWAY_KEY_ENV
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, status
from fleetctl.controller.responses import EngineView
from fleetctl.errors import ValidationFailed
from fleetctl.replica_class import ReplicaClassSpec, correctness_digest

golden_app = typer.Typer(no_args_is_help=True, help="Golden sets: check a file offline.")
app.add_typer(golden_app, name="golden")

GatewayOption = Annotated[str, typer.Option("--gateway", envvar=GATEWAY_ENV, help="gateway URL")]
ApiKeyOption = Annotated[str | None, typer.Option("--api-key", envvar=GATEWAY_KEY_ENV, help="client API key",
                                                  show_default=False)]
REFERENCE_COLUMNS = [
    col("ID", "id"), col("MODEL", "model"), col("CLASS", "class_ref"),
    Column("GOLDEN", lambda r: f"{r['golden_set']} v{r['golden_version']}"), col("PROMPTS", "prompts"),
    Column("DIVERGED", lambda r: " ".join(f"b{c}:{n['diverged']}/{n['runs']}" for c, n in r["noise"].items())),
    Column("EXPECTED", lambda r: f"{r['expected_passed']}/{r['expected_passed'] + r['expected_failed']} pass"),
    col("RECORDED", "recorded_at"),
]


# --- commands ---

@app.command("record")
def record(
    ctx: typer.Context,
    class_ref: Annotated[str, typer.Option("--class", help="the known-good class revision, NAME@rN")],
    golden: Annotated[str, typer.Option("--golden", help="golden-set file (YAML or JSONL), or a shipped set: smollm2, tiny")],
    gateway: GatewayOption = DEFAULT_GATEWAY,
    api_key: ApiKeyOption = None,
    repetitions: Annotated[int, typer.Option("--repetitions", min=1, max=100, help="runs per prompt and batch condition")] = 3,
    conditions: Annotated[str, typer.Option("--conditions", help="batch conditions, e.g. 1,4,8,16")] = ",".join(map(str, BATCH_CONDITIONS)),
    timeout_s: Annotated[float, typer.Option("--timeout", min=1.0, help="seconds one probe (with its fillers) may take")] = 300.0,
    reason: ReasonOption = None,
    output: OutputOption = Format.table,
) -> None:
    """Record a reference (token ids, top-k logprobs, the class's own noise) from a class revision."""
    path = golden_path(golden)
    golden_set = load_golden(path)
    batch_conditions = parse_conditions(conditions)
    api = client(ctx)
    revision = api.get_class(class_ref)  # NAME resolves to its latest revision
    spec, ref = ReplicaClassSpec.model_validate(revision.spec), revision.ref
    check_model(golden_set, spec.model, source=path.name)  # before asking the gateway anything
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    counts = asyncio.run(_count_tokens(gateway, golden_set, ref, headers, path.name))
    check_against_class(golden_set, spec, spec.model, counts, source=path.name)
    stored = api.put_golden_set(golden_set.model_dump(mode="json"), reason=reason)
    status(f"golden set {stored.name} v{stored.version}: {stored.result} ({stored.prompts} prompts)")
    engines = ready_engines(api.list_engines(), ref)
    reference = asyncio.run(_record(gateway, golden_set, ref, correctness_digest(spec), headers, repetitions,
                                    batch_conditions, timeout_s, engines))
    summary = api.put_reference(reference.model_dump(mode="json"), reason=reason)
    report = record_report(reference, golden_set, summary.model_dump(mode="json"))
    if output is Format.table:
        typer.echo(describe_report(report))
    else:
        emit(report, output)


@app.command("references")
def references(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Argument(help="only this model's", show_default=False)] = None,
    output: OutputOption = Format.table,
) -> None:
    """The stored references, oldest first: prompts, the class's noise per batch condition, expected answers."""
    emit(client(ctx).list_references(model=model), output, REFERENCE_COLUMNS)


@golden_app.command("check")
def golden_check(
    file: Annotated[str, typer.Argument(help="golden-set file (YAML or JSONL), or a shipped set: smollm2, tiny")],
    output: OutputOption = Format.table,
) -> None:
    """Validate a golden-set file offline (no controller, no gateway): one line naming the entry if it is bad."""
    golden_set = load_golden(golden_path(file))
    summary = golden_summary(golden_set)
    if output is Format.table:
        typer.echo(f"golden set {summary['name']} v{summary['version']} for {summary['model']}: {summary['prompts']} "
                   f"prompts ({summary['chat']} chat, {summary['completion']} completion; {summary['seeded']} seeded; "
                   f"{summary['expected']} with expected answers); digest {summary['digest'][:12]}")
    else:
        emit(summary, output)


# --- helpers (pure where they can be) ---

def golden_path(text: str) -> Path:
    """A file, or (when no such file exists) the name of a shipped golden set."""
    path = Path(text)
    if path.exists() or "/" in text or path.suffix:
        return path
    try:
        return shipped_golden(text)
    except GoldenSetError:
        return path  # load_golden says the file cannot be read


def ready_engines(engines: Sequence[EngineView], ref: str) -> list[str]:
    """The names of `ref`'s ready engines, neither drained nor cordoned, sorted (as the controller's probes
    walk them)."""
    return sorted(e.name for e in engines
                  if e.class_ref == ref and e.state == "ready" and not e.drain and not e.cordoned)


def parse_conditions(text: str) -> list[int]:
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise ValidationFailed(f"--conditions: {text!r} is not a comma-separated list of batch sizes, e.g. 1,4,8,16",
                               field="conditions")
    return values


def golden_summary(golden_set: GoldenSet) -> dict[str, Any]:
    prompts = golden_set.prompts
    return {"name": golden_set.name, "version": golden_set.version, "model": golden_set.model,
            "prompts": len(prompts), "chat": sum(p.messages is not None for p in prompts),
            "completion": sum(p.prompt is not None for p in prompts),
            "seeded": sum(p.sampling.temperature > 0 for p in prompts),
            "expected": sum(p.expected is not None for p in prompts), "digest": golden_digest(golden_set)}


def record_report(reference: Reference, golden_set: GoldenSet, summary: dict[str, Any]) -> dict[str, Any]:
    with_expected = [p for p in golden_set.prompts if p.expected is not None]
    p0 = stream_p0(reference, None, golden_set.p0_floor)
    return {**summary,
            "expected_pass": [p.id for p in with_expected if reference.prompts[p.id].expected_pass],
            "expected_fail": [p.id for p in with_expected if not reference.prompts[p.id].expected_pass],
            "p0": round(p0, 4), "p0_floor": golden_set.p0_floor,
            "runs_for_tight_p0": runs_for_p0(P0_WARN_FACTOR * golden_set.p0_floor)}


P0_WARN_FACTOR = 2.0  # a noise bound over this many times the floor is worth a warning


def runs_for_p0(target: float) -> int:
    """How many recorded runs, none of them diverged, bring the 95% upper bound on the noise down to
    `target` (about 3 / target: the rule of three)."""
    runs = 1
    while upper_bound(0, runs) > target:
        runs += 1
    return runs


def p0_warning(report: dict[str, Any]) -> str | None:
    """A line when the recorded runs are too few (or too noisy) to bound the noise near the floor: the tests
    then assume that much noise, and need more probes to tell a real shift from it."""
    if report["p0"] <= P0_WARN_FACTOR * report["p0_floor"]:
        return None
    return (f"warning: the runs bound the noise the drift tests assume at p0 {report['p0']:.3f}, over "
            f"{P0_WARN_FACTOR:g}x the floor {report['p0_floor']:g}; a shift then takes more probes to detect. "
            f"About {report['runs_for_tight_p0']} runs with none diverged bring it to "
            f"{P0_WARN_FACTOR * report['p0_floor']:g} (more --repetitions or --conditions).")


def describe_report(report: dict[str, Any]) -> str:
    lines = [f"reference {report['id']}: {report['model']} from {report['class_ref']}, golden set "
             f"{report['golden_set']} v{report['golden_version']}, {report['prompts']} prompts"]
    for condition, noise in report["noise"].items():
        lines.append(f"  b{condition}: {noise['diverged']}/{noise['runs']} runs diverged from the reference, "
                     f"max distance {noise['max_distance']:.4f}")
    total = len(report["expected_pass"]) + len(report["expected_fail"])
    if total:
        lines.append(f"expected answers: {len(report['expected_pass'])}/{total} pass"
                     + (f"; fail (left out of the answer test): {', '.join(report['expected_fail'])}"
                        if report["expected_fail"] else ""))
    warning = p0_warning(report)
    return "\n".join(lines + ([warning] if warning else []))


# --- the gateway side ---

async def _count_tokens(gateway: str, golden_set: GoldenSet, ref: str, headers: dict[str, str],
                        source: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    async with httpx.AsyncClient() as http:
        for index, prompt in enumerate(golden_set.prompts):
            try:
                counts[prompt.id] = await prompt_token_count(http, gateway, golden_set.model, prompt, pin=ref,
                                                             headers=headers)
            except ProbeError as exc:
                if exc.http_status != 400:
                    raise
                # the gateway refuses a prompt that leaves no room in the window: the file's fault
                raise GoldenSetError(f"golden set {source}: prompts[{index}] (id {prompt.id!r}): {exc.detail}",
                                     field=f"prompts.{index}") from None
    return counts


async def _record(gateway: str, golden_set: GoldenSet, ref: str, digest: str, headers: dict[str, str],
                  repetitions: int, conditions: list[int], timeout_s: float, engines: list[str]) -> Reference:
    """Each run pinned to the revision's engines in turn, as the controller's pinned probes are (so the noise
    recorded is the class's across its engines); a run at batch condition c has c - 1 short fillers beside it."""
    limits = httpx.Limits(max_connections=max(conditions) + 4)
    runs = itertools.count()
    async with httpx.AsyncClient(limits=limits) as http:
        async def send(prompt: GoldenPrompt, fillers: int) -> ProbeOutput:
            engine = engines[next(runs) % len(engines)] if engines else None
            return await send_probe(http, gateway, golden_set.model, prompt, kind="pinned", pin=ref, fillers=fillers,
                                    engine=engine, headers=headers, timeout_s=timeout_s)

        return await record_reference(send, golden_set, ref, digest, repetitions=repetitions, conditions=conditions,
                                      recorded_by="fleetctl canary record", now=datetime.now(timezone.utc),
                                      progress=status)

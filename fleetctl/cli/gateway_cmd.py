"""`fleetctl gateway serve|list` and `fleetctl route explain`: the front door, the gateways the controller
knows, and asking one how it would route.

    fleetctl gateway serve [--controller URL] [--token T] [--engines URL[,URL...]] [--host H] [--port P] ...
    fleetctl gateway list [-o table|json|yaml]
    fleetctl route explain --model M --prompt-file F [--chat] [--gateway URL] [-o table|json|yaml]

NAME is None: main.py merges this module's two groups (`gateway`, `route`) into the root. `gateway serve`'s
options are GatewaySettings' fields (fleetctl/cli/settings_options.py): their help and defaults come from
the settings class. Of the gateway package only its settings module is imported until `gateway serve` runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from fleetctl.cli.context import cli, client, local_token
from fleetctl.cli.output import Format, OutputOption, col, emit
from fleetctl.cli.status_cmd import GATEWAY_COLUMNS
from fleetctl.cli.settings_options import OptionMap, build_settings, given, setting_option
from fleetctl.errors import Unavailable, ValidationFailed, error_from_body
from fleetctl.gateway.settings import API_KEYS_ENV, ENGINE_API_KEY_ENV, GatewaySettings

NAME = None
DEFAULT_GATEWAY = "http://127.0.0.1:8000"
GATEWAY_ENV = "FLEET_GATEWAY"
GATEWAY_KEY_ENV = "FLEET_GATEWAY_API_KEY"

app = typer.Typer(help="The gateway: serve, and explain routes.")
gateway_app = typer.Typer(no_args_is_help=True, help="The gateway (OpenAI-compatible front door, router, admission).")
route_app = typer.Typer(no_args_is_help=True, help="Routes: explain how the gateway would route a request.")
app.add_typer(gateway_app, name="gateway")
app.add_typer(route_app, name="route")

CANDIDATE_COLUMNS = [
    col("RANK", "rank"), col("STAGE", "stage"), col("ENGINE", "engine"), col("ROLE", "role"), col("SCORE", "score"),
    col("CACHED", "cached_blocks"), col("TIER_FETCH_S", "tier_fetch_s"), col("PREFILL_S", "predicted_prefill_s"),
    col("SHARE", "recent_share"),
    col("HASHES", "prefix_hashes"), col("REASON", "reason"),
]


def _parse_flags(values: list[str]) -> dict[str, Any]:
    flags: dict[str, Any] = {}
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise ValidationFailed(f"--flag {item!r}: expected NAME=VALUE", field="flag")
        lowered = raw.strip().lower()
        flags[name.strip()] = True if lowered == "true" else False if lowered == "false" else raw
    return flags


def _opt(field: str, *flags: str, **kwargs: Any) -> Any:
    return setting_option(GatewaySettings, field, *flags, **kwargs)


SERVE_OPTIONS = OptionMap(
    settings=GatewaySettings,
    renamed={"controller": "controller_url", "token": "controller_token", "engines": "static_engines",
             "flag": "static_flags", "name": "gateway_name"},
    not_settings={"log_level": "how much the process logs, not how the gateway behaves"},
    not_options={"api_keys_env": f"client keys are secrets, read from env {API_KEYS_ENV} only (a flag would "
                 "show them in the process list)",
                 "breakglass_token": "a secret: read from --breakglass-token-file (a flag would show it in the "
                 "process list)"},
)


@gateway_app.command()
def serve(
    ctx: typer.Context,
    controller: Annotated[str | None, _opt("controller_url", "--controller", default_text="the global --controller")] = None,
    token: Annotated[str | None, _opt("controller_token", "--token",
                                      default_text="the global --token or the local bootstrap token")] = None,
    engines: Annotated[list[str] | None, _opt("static_engines", "--engines", metavar="URL[,URL...]")] = None,
    flag: Annotated[list[str] | None, _opt("static_flags", "--flag", metavar="NAME=VALUE")] = None,
    host: Annotated[str | None, _opt("host", "--host")] = None,
    port: Annotated[int | None, _opt("port", "--port")] = None,
    name: Annotated[str | None, _opt("gateway_name", "--name")] = None,
    advertise_url: Annotated[str | None, _opt("advertise_url", "--advertise-url")] = None,
    api_keys_file: Annotated[Path | None, _opt("api_keys_file", "--api-keys-file")] = None,
    engine_api_key: Annotated[str | None, _opt("engine_api_key", "--engine-api-key", envvar=ENGINE_API_KEY_ENV)] = None,
    admission: Annotated[bool | None, _opt("admission", "--admission/--no-admission")] = None,
    ttft_slo_s: Annotated[float | None, _opt("ttft_slo_s", "--ttft-slo-s")] = None,
    max_decode_slots: Annotated[int | None, _opt("max_decode_slots", "--max-decode-slots")] = None,
    default_prefill_tokens_per_s: Annotated[float | None, _opt("default_prefill_tokens_per_s",
                                                               "--default-prefill-tokens-per-s")] = None,
    default_decode_step_s: Annotated[float | None, _opt("default_decode_step_s", "--default-decode-step-s")] = None,
    max_retries: Annotated[int | None, _opt("max_retries", "--max-retries")] = None,
    connect_timeout_s: Annotated[float | None, _opt("connect_timeout_s", "--connect-timeout-s")] = None,
    first_token_timeout_s: Annotated[float | None, _opt("first_token_timeout_s", "--first-token-timeout-s")] = None,
    idle_timeout_s: Annotated[float | None, _opt("idle_timeout_s", "--idle-timeout-s")] = None,
    request_timeout_s: Annotated[float | None, _opt("request_timeout_s", "--request-timeout-s")] = None,
    keepalive_interval_s: Annotated[float | None, _opt("keepalive_interval_s", "--keepalive-interval-s")] = None,
    probe_interval_s: Annotated[float | None, _opt("probe_interval_s", "--probe-interval-s")] = None,
    probe_timeout_s: Annotated[float | None, _opt("probe_timeout_s", "--probe-timeout-s")] = None,
    table_refresh_s: Annotated[float | None, _opt("table_refresh_s", "--table-refresh-s")] = None,
    locality_weight: Annotated[float | None, _opt("locality_weight", "--locality-weight")] = None,
    hot_spot_factor: Annotated[float | None, _opt("hot_spot_factor", "--hot-spot-factor")] = None,
    hot_spot_damping: Annotated[float | None, _opt("hot_spot_damping", "--hot-spot-damping")] = None,
    engines_share_hardware: Annotated[bool | None, _opt(
        "engines_share_hardware", "--engines-share-hardware/--engines-own-hardware")] = None,
    share_half_life_requests_per_engine: Annotated[float | None, _opt(
        "share_half_life_requests_per_engine", "--share-half-life-requests-per-engine")] = None,
    shared_prefix_requests: Annotated[float | None, _opt("shared_prefix_requests", "--shared-prefix-requests")] = None,
    shared_hardware_own_load: Annotated[float | None, _opt("shared_hardware_own_load", "--shared-hardware-own-load")] = None,
    running_cost_steps: Annotated[float | None, _opt("running_cost_steps", "--running-cost-steps")] = None,
    warm_prefix_requests: Annotated[float | None, _opt("warm_prefix_requests", "--warm-prefix-requests")] = None,
    warm_min_blocks: Annotated[int | None, _opt("warm_min_blocks", "--warm-min-blocks")] = None,
    max_sessions: Annotated[int | None, _opt("max_sessions", "--max-sessions")] = None,
    hash_seed: Annotated[str | None, _opt("hash_seed", "--hash-seed")] = None,
    state_dir: Annotated[Path | None, _opt("state_dir", "--state-dir")] = None,
    breakglass_token_file: Annotated[Path | None, _opt("breakglass_token_file", "--breakglass-token-file")] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error")] = "info",
) -> None:
    """Run the gateway: OpenAI-compatible /v1 API routed over the fleet's engines. With --state-dir it
    also takes direct (break-glass) flag overrides on its own credential, without the controller."""
    from fleetctl.gateway.server import serve as run
    from fleetctl.gateway.static_table import parse_static_engines

    static = tuple(e for item in (engines or []) for e in item.split(",") if e.strip())
    try:
        parse_static_engines(static)
    except ValueError as exc:
        raise ValidationFailed(str(exc), field="engines") from None
    root = cli(ctx)
    table_source = {"static_engines": static, "static_flags": _parse_flags(flag or [])} if static else {
        "controller_url": controller or root.controller, "controller_token": token or root.token or local_token()}
    settings = build_settings(GatewaySettings, {
        **table_source,
        **given(api_keys_env=os.environ.get(API_KEYS_ENV), host=host, port=port, gateway_name=name,
                advertise_url=advertise_url, api_keys_file=api_keys_file, engine_api_key=engine_api_key,
                admission=admission, ttft_slo_s=ttft_slo_s, max_decode_slots=max_decode_slots,
                default_prefill_tokens_per_s=default_prefill_tokens_per_s, default_decode_step_s=default_decode_step_s,
                max_retries=max_retries, connect_timeout_s=connect_timeout_s,
                first_token_timeout_s=first_token_timeout_s, idle_timeout_s=idle_timeout_s,
                request_timeout_s=request_timeout_s, keepalive_interval_s=keepalive_interval_s,
                probe_interval_s=probe_interval_s, probe_timeout_s=probe_timeout_s, table_refresh_s=table_refresh_s,
                locality_weight=locality_weight, hot_spot_factor=hot_spot_factor, hot_spot_damping=hot_spot_damping,
                engines_share_hardware=engines_share_hardware, shared_prefix_requests=shared_prefix_requests,
                running_cost_steps=running_cost_steps, shared_hardware_own_load=shared_hardware_own_load,
                share_half_life_requests_per_engine=share_half_life_requests_per_engine,
                warm_prefix_requests=warm_prefix_requests, warm_min_blocks=warm_min_blocks,
                max_sessions=max_sessions, hash_seed=hash_seed,
                state_dir=state_dir, breakglass_token_file=breakglass_token_file),
    })
    if api_keys_file is not None and not api_keys_file.is_file():
        raise ValidationFailed(f"--api-keys-file {api_keys_file}: no such file", field="api_keys_file")
    run(settings, log_level=log_level.lower())


@gateway_app.command("list")
def gateway_list(ctx: typer.Context, output: OutputOption = Format.table) -> None:
    """Every gateway that reported to the controller: URL, routing-table age and applied generation, and
    whether it is live or stale (not heard from for 3 of its refresh intervals)."""
    emit(client(ctx).list_gateways(), output, GATEWAY_COLUMNS)


@route_app.command()
def explain(
    model: Annotated[str, typer.Option("--model", help="the model clients ask for")],
    prompt_file: Annotated[Path, typer.Option("--prompt-file", help="the prompt (text)", exists=True, dir_okay=False)],
    chat: Annotated[bool, typer.Option("--chat", help="send the prompt as one user message of a chat request")] = False,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", help="the request's max_tokens", show_default=False)] = None,
    gateway: Annotated[str, typer.Option("--gateway", envvar=GATEWAY_ENV, help="gateway URL")] = DEFAULT_GATEWAY,
    api_key: Annotated[str | None, typer.Option("--api-key", envvar=GATEWAY_KEY_ENV, help="client API key", show_default=False)] = None,
    pin_class: Annotated[str | None, typer.Option("--pin-class", help="as the x-fleet-pin-class header", show_default=False)] = None,
    session: Annotated[str | None, typer.Option("--session", help="as the x-session-id header", show_default=False)] = None,
    output: OutputOption = Format.table,
) -> None:
    """Rank the engines the gateway would choose for a request, with each score and why (nothing is sent)."""
    prompt = prompt_file.read_text()
    body: dict[str, Any] = {"model": model}
    body.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    headers = {k: v for k, v in {"Authorization": f"Bearer {api_key}" if api_key else None,
                                 "x-fleet-pin-class": pin_class, "x-session-id": session}.items() if v}
    answer = _post(gateway, "/fleet/route/explain", body, headers)
    if output is not Format.table:
        emit(answer, output)
        return
    typer.echo(_summary(answer))
    emit(answer["candidates"] + answer["decode_candidates"], output, CANDIDATE_COLUMNS)
    for row in answer.get("ineligible") or []:
        hashes = "; its prefix hashes use another seed" if row.get("prefix_hashes") == "hash_mismatch" else ""
        typer.echo(f"not eligible: {row['engine']} ({row['role']}): {row['why']}{hashes}")
    cross_node = answer.get("cross_node")
    if cross_node is not None:
        typer.echo(f"cross-node KV for {cross_node['engine']}: {cross_node['reason']}")
    warm = answer.get("warm")
    if warm is not None:
        typer.echo(f"would warm {warm['blocks']} blocks on idle {warm['engine']} (it holds {warm['cached_blocks']}; "
                   f"~{warm['prefix_requests']:g} recent requests began with them)")


def _post(gateway: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    url = gateway.rstrip("/")
    try:
        response = httpx.post(url + path, json=body, headers=headers, timeout=30.0)
    except httpx.HTTPError as exc:
        raise Unavailable(f"gateway at {url} unreachable ({type(exc).__name__})") from None
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.status_code >= 400:
        raise error_from_body(response.status_code, data)
    return data


def _summary(answer: dict[str, Any]) -> str:
    admission = answer.get("admission")
    admitted = "off" if admission is None else ("admit" if admission["admit"] else f"reject (retry after {admission['retry_after_s']}s)")
    lines = [
        f"model {answer['model']}  class {answer['class_ref']}  traffic {answer['traffic']}",
        f"prompt {answer['num_prompt_tokens']} tokens, {answer['num_blocks']} full blocks; max_tokens {answer['max_tokens']}; "
        f"context window {answer['context_window']}",
        f"mode {answer['mode']}" + (f" (fallback: {answer['fallback']})" if answer.get("fallback") else ""),
        f"admission: {admitted}" + (f": {admission['reason']}" if admission else ""),
    ]
    return "\n".join(lines)

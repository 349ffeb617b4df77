"""`fleetctl gateway serve` and `fleetctl route explain`: the front door, and asking it how it would route.

    fleetctl gateway serve [--controller URL] [--token T] [--engines URL[,URL...]] [--host H] [--port P] ...
    fleetctl route explain --model M --prompt-file F [--chat] [--gateway URL] [-o table|json|yaml]

NAME is None: main.py merges this module's two groups (`gateway`, `route`) into the root. The gateway
package is imported only when `gateway serve` runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from fleetctl.cli.context import cli, local_token
from fleetctl.cli.output import Format, OutputOption, col, emit
from fleetctl.errors import Unavailable, ValidationFailed, error_from_body

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
    col("CACHED", "cached_blocks"), col("PREFILL_S", "predicted_prefill_s"), col("SHARE", "recent_share"),
    col("REASON", "reason"),
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


@gateway_app.command()
def serve(
    ctx: typer.Context,
    controller: Annotated[str | None, typer.Option("--controller", help="controller URL [default: the global --controller]", show_default=False)] = None,
    token: Annotated[str | None, typer.Option("--token", help="viewer token for the routing table [default: the global --token or the local bootstrap token]", show_default=False)] = None,
    engines: Annotated[list[str] | None, typer.Option("--engines", help="static engines instead of a controller: URL[?role=prefill|decode&kv_events=tcp://H:P][,URL...]", show_default=False)] = None,
    flag: Annotated[list[str] | None, typer.Option("--flag", help="static mode: a routing-table flag NAME=VALUE, e.g. pd_disabled:MODEL=true", show_default=False)] = None,
    host: Annotated[str, typer.Option("--host", help="listen address")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="listen port")] = 8000,
    name: Annotated[str | None, typer.Option("--name", help="the name the controller lists this gateway by [default: HOSTNAME-PORT]", show_default=False)] = None,
    advertise_url: Annotated[str | None, typer.Option("--advertise-url", help="the URL reported to the controller [default: http://HOST:PORT]", show_default=False)] = None,
    api_keys_file: Annotated[Path | None, typer.Option("--api-keys-file", help="client keys, lines NAME:KEY:RPS [also env FLEET_GATEWAY_API_KEYS]; none: open", show_default=False)] = None,
    engine_api_key: Annotated[str | None, typer.Option("--engine-api-key", envvar="FLEET_ENGINE_API_KEY", help="key for engines started with --api-key", show_default=False)] = None,
    admission: Annotated[bool, typer.Option("--admission/--no-admission", help="refuse requests predicted to break the SLO (429)")] = True,
    ttft_slo_s: Annotated[float, typer.Option("--ttft-slo-s", help="admission: the predicted time-to-first-token limit, seconds")] = 30.0,
    max_decode_slots: Annotated[int | None, typer.Option("--max-decode-slots", help="admission: concurrent decodes per engine [default: the class's max_num_seqs]", show_default=False)] = None,
    max_retries: Annotated[int, typer.Option("--max-retries", help="other engines tried after a failure before the first token")] = 2,
    connect_timeout_s: Annotated[float, typer.Option("--connect-timeout-s", help="engine connect timeout")] = 2.0,
    first_token_timeout_s: Annotated[float, typer.Option("--first-token-timeout-s", help="request sent -> first token")] = 60.0,
    idle_timeout_s: Annotated[float, typer.Option("--idle-timeout-s", help="longest silence inside a stream")] = 60.0,
    request_timeout_s: Annotated[float, typer.Option("--request-timeout-s", help="a whole non-streamed answer")] = 600.0,
    keepalive_interval_s: Annotated[float, typer.Option("--keepalive-interval-s", help="SSE keep-alive comment interval")] = 5.0,
    probe_interval_s: Annotated[float, typer.Option("--probe-interval-s", help="engine /health and /metrics probe interval")] = 1.0,
    table_refresh_s: Annotated[float, typer.Option("--table-refresh-s", help="routing-table refresh interval")] = 2.0,
    locality_weight: Annotated[float, typer.Option("--locality-weight", help="scorer: worth of a second of prefill a cached prefix saves, against a second of queue (fleetctl/gateway/scorer.py)")] = 2.0,
    hot_spot_factor: Annotated[float, typer.Option("--hot-spot-factor", help="scorer: an engine above this x the mean traffic share competes on load alone")] = 1.5,
    hash_seed: Annotated[str | None, typer.Option("--hash-seed", help="prefix-hash seed [default: env FLEET_HASH_SEED or 0]", show_default=False)] = None,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning, error")] = "info",
) -> None:
    """Run the gateway: OpenAI-compatible /v1 API routed over the fleet's engines."""
    from fleetctl.gateway.server import serve as run
    from fleetctl.gateway.settings import GatewaySettings
    from fleetctl.gateway.static_table import parse_static_engines

    static = tuple(e for item in (engines or []) for e in item.split(",") if e.strip())
    try:
        parse_static_engines(static)
    except ValueError as exc:
        raise ValidationFailed(str(exc), field="engines") from None
    root = cli(ctx)
    options: dict[str, Any] = {}
    if hash_seed is not None:
        options["hash_seed"] = hash_seed
    try:
        settings = GatewaySettings(
            host=host, port=port, gateway_name=name, advertise_url=advertise_url,
            controller_url=None if static else (controller or root.controller),
            controller_token=None if static else (token or root.token or local_token()),
            static_engines=static, static_flags=_parse_flags(flag or []), table_refresh_s=table_refresh_s,
            api_keys_file=api_keys_file, api_keys_env=os.environ.get("FLEET_GATEWAY_API_KEYS"),
            engine_api_key=engine_api_key, probe_interval_s=probe_interval_s,
            connect_timeout_s=connect_timeout_s, first_token_timeout_s=first_token_timeout_s,
            idle_timeout_s=idle_timeout_s, request_timeout_s=request_timeout_s,
            keepalive_interval_s=keepalive_interval_s, max_retries=max_retries,
            admission=admission, ttft_slo_s=ttft_slo_s, max_decode_slots=max_decode_slots,
            locality_weight=locality_weight, hot_spot_factor=hot_spot_factor, **options,
        )
    except ValueError as exc:
        raise ValidationFailed(str(exc)) from None
    if api_keys_file is not None and not api_keys_file.is_file():
        raise ValidationFailed(f"--api-keys-file {api_keys_file}: no such file", field="api_keys_file")
    run(settings, log_level=log_level.lower())


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
        typer.echo(f"not eligible: {row['engine']} ({row['role']}): {row['why']}")


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

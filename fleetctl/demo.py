"""`make demo` (`python -m fleetctl.demo`): a local fleet serving SmolLM2, a few chat requests, the fleet's
status, two rollouts under live requests (one completes; one to engines made slow is aborted by its
latency gate: fleetctl/demo_rollout.py), the quality canary catching a 15% misroute drill to a long-context
build (fleetctl/demo_canary.py), break-glass with the controller stopped (fleetctl/demo_breakglass.py), then
`fleetctl down` (unless --keep).

The demo's fleet lives in its own state dir (`demo_state_dir()`), started afresh on every run: a fleet kept
by an earlier `--keep` is stopped with `fleetctl down` first and its state removed, so the rollouts always
start from the one revision `fleetctl up` deploys.

Every step is the command a user would type (`fleetctl up --detach`, `fleetctl status`, `fleetctl down`),
run as a subprocess, so the demo shows the real path. Requests go through the gateway, which routes each one
by prefix locality and load and says which engine served it (`x-fleet-served-by`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from agent.ports import port_is_free
from engine.contract import REFERENCE_MODELS
from fleetctl.client import DEFAULT_CONTROLLER
from fleetctl.controller.paths import default_state_dir
from fleetctl.demo_breakglass import run_breakglass
from fleetctl.demo_canary import PROBE_ENV, run_canary
from fleetctl.demo_rollout import run_rollouts
from fleetctl.localfleet.fleet import FLEET_FILE
from fleetctl.localfleet.processes import child_env, fleetctl_argv

QUESTIONS = [
    "What is the capital of France?",
    "Give me one tip for writing clear code.",
    "Name three colours of the rainbow.",
]


def demo_state_dir() -> Path:
    return default_state_dir() / "demo"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _fresh(demo_state_dir())
    fleet = _up(args)
    if fleet is None:
        return 1
    env = {"FLEET_CONTROLLER": fleet["controller_url"], "FLEET_TOKEN": _token(fleet)}
    ok = True
    try:
        _ask(fleet, args.max_tokens)
        _run(["status"], env)
        if args.rollouts:
            ok = run_rollouts(fleet, env, Path(fleet["state_dir"]) / "files")
        if args.canary:
            ok = run_canary(fleet, env, Path(fleet["state_dir"]) / "files") and ok
        if args.breakglass:
            ok = run_breakglass(fleet, lambda command: _run(command, env),
                                lambda question: _answer(fleet, question, args.max_tokens)) and ok
    finally:
        if args.keep:
            print(f"\nthe fleet keeps running; watch it live with: {_tui_command(fleet)}"
                  f"\nstop it with: fleetctl down --state-dir {fleet['state_dir']}")
        else:
            print(f"\nwhile a fleet runs, `{_tui_command(fleet)}` shows it live; to keep this one running for "
                  "it, run the demo with --keep (.venv/bin/python -m fleetctl.demo --keep)")
            _run(["down", "--state-dir", fleet["state_dir"]])
    return 0 if ok else 1


def _tui_command(fleet: dict[str, Any]) -> str:
    """How to open the live fleet view on this fleet (the CLI finds its token in the state dir)."""
    return (f"FLEET_STATE_DIR={shlex.quote(str(fleet['state_dir']))} fleetctl "
            f"--controller {fleet['controller_url']} tui")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fleetctl.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the fleet running at the end")
    parser.add_argument("--nodes", type=int, default=2, help="agents (one engine each)")
    parser.add_argument("--model", choices=REFERENCE_MODELS, default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per answer")
    parser.add_argument("--no-rollouts", dest="rollouts", action="store_false", help="skip the two rollouts")
    parser.add_argument("--no-canary", dest="canary", action="store_false", help="skip the quality canary and its drill")
    parser.add_argument("--no-breakglass", dest="breakglass", action="store_false",
                        help="skip direct mode with the controller stopped")
    return parser


def _fresh(state_dir: Path) -> None:
    """Stop a fleet an earlier demo kept running there, then remove its state (its database, logs, files)."""
    if (state_dir / FLEET_FILE).exists():
        _run(["down", "--state-dir", str(state_dir)])
    shutil.rmtree(state_dir, ignore_errors=True)


def _up(args: argparse.Namespace) -> dict[str, Any] | None:
    """`fleetctl up --detach`; its progress shows on the terminal, its JSON summary is parsed."""
    port = "8080" if port_is_free(int(DEFAULT_CONTROLLER.rsplit(":", 1)[1])) else "0"
    gateway_port = "8000" if port_is_free(8000) else "0"
    command = ["up", "--detach", "--model", args.model, "--nodes", str(args.nodes), "--controller-port", port,
               "--gateway-port", gateway_port,
               "--state-dir", str(demo_state_dir()), "-o", "json"]
    print(f"$ fleetctl {' '.join(command)}", flush=True)
    result = subprocess.run(fleetctl_argv(*command), stdout=subprocess.PIPE, text=True, env=child_env(PROBE_ENV))
    if result.returncode != 0:
        print(f"fleetctl up failed (exit {result.returncode}); see the messages above", file=sys.stderr)
        return None
    return json.loads(result.stdout)


def _ask(fleet: dict[str, Any], max_tokens: int) -> None:
    gateway = fleet["gateway_url"]
    print(f"\n{len(fleet['engines'])} engine(s) serving {fleet['served_model']} behind the gateway at {gateway}; "
          f"asking {len(QUESTIONS)} questions\n")
    for question in QUESTIONS:
        started = time.monotonic()
        answer, served_by = _chat(gateway, fleet["served_model"], question, max_tokens)
        print(f"Q: {question}\nA: {answer.strip()}\n   (served by {served_by}, {time.monotonic() - started:.1f}s)\n")


def _answer(fleet: dict[str, Any], question: str, max_tokens: int) -> str:
    answer, served_by = _chat(fleet["gateway_url"], fleet["served_model"], question, max_tokens)
    return f"{answer.strip()!r} (served by {served_by})"


def _chat(url: str, model: str, question: str, max_tokens: int) -> tuple[str, str]:
    body = {"model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"], response.headers.get("x-fleet-served-by", "?")


def _run(command: list[str], env: dict[str, str] | None = None) -> None:
    print(f"\n$ fleetctl {' '.join(command)}", flush=True)
    subprocess.run(fleetctl_argv(*command), env=child_env(env or {}), check=False)


def _token(fleet: dict[str, Any]) -> str:
    with open(fleet["token_file"]) as handle:
        return handle.read().strip()


if __name__ == "__main__":
    sys.exit(main())

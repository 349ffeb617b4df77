"""The reference engine's and the gateway's APIs under schema-driven fuzzing: a real tiny engine process and
a gateway process routing to it (static table), on loopback. No answer is a 5xx, every status is one the
schema declares, and afterwards the gateway still serves a completion through the engine."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fuzzing import fuzz
from gateway.procs import Launcher, Proc, static_entry

BUDGET_S = 30.0
EXAMPLES = 40  # per operation and mode
# Operations that would take the service under test away: the fuzzer must not drain the engine it fuzzes.
DESTRUCTIVE = {("POST", "/drain")}


SHORT_OUTPUT = 4  # generated max_tokens above this are cut to it: the fuzz is about inputs, not long generations


def keep_generations_short(case) -> None:  # noqa: ANN001 - a schemathesis Case
    """Cut a valid (integer) max_tokens / max_completion_tokens to SHORT_OUTPUT; invalid ones stay as generated."""
    if isinstance(case.body, dict):
        for key in ("max_tokens", "max_completion_tokens"):
            value = case.body.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > SHORT_OUTPUT:
                case.body[key] = SHORT_OUTPUT


@pytest.fixture(scope="module")
def fleet(launcher: Launcher) -> Iterator[tuple[Proc, Proc]]:
    engine = launcher.engine()
    gateway = launcher.gateway("--engines", static_entry(engine))
    yield engine, gateway


def assert_clean(report) -> None:  # noqa: ANN001 - fuzzing.FuzzReport
    print(report.summary())
    assert report.server_errors == []
    assert report.undeclared == []
    assert len(report.statuses) >= 5 and report.cases >= 50
    assert 200 in report.totals() and 400 in report.totals()  # it reached the handlers and their validation


def test_the_engine_api_survives_fuzzing(fleet: tuple[Proc, Proc]) -> None:
    engine, _gateway = fleet
    schema = engine.get("/openapi.json").json()
    assert_clean(fuzz("engine", engine.url, schema, {}, BUDGET_S, EXAMPLES,
                      skip=lambda method, path: (method, path) in DESTRUCTIVE, prepare=keep_generations_short))
    assert engine.get("/health").status_code == 200


def test_the_gateway_api_survives_fuzzing_and_still_serves(fleet: tuple[Proc, Proc]) -> None:
    engine, gateway = fleet
    schema = gateway.get("/openapi.json").json()
    assert_clean(fuzz("gateway", gateway.url, schema, {}, BUDGET_S, EXAMPLES, prepare=keep_generations_short))
    served = gateway.post("/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 3})
    assert served.status_code == 200, served.text
    assert served.json()["usage"]["completion_tokens"] == 3
    assert engine.get("/health").status_code == 200

"""Every failure is a documented exit code and one readable stderr line, never a traceback; refused
input stores nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import Fleet, class_file, one_error_line
from typer.testing import CliRunner

from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.main import app
from fleetctl.controller.server import free_port

BAD_CLASS_FILES = [
    ("name: ''\nspec: {model: m, weights: smollm2}\n", "'name' is missing or blank"),
    ("spec: {model: m, weights: smollm2}\n", "'name' is missing or blank"),
    ("name: chat\n", "'spec' is missing or not a mapping"),
    ("name: chat\nspec: {model: m, weights: smollm2}\nextra: 1\n", "unknown top-level field 'extra'"),
    ("name: chat\nspec: {model: '  ', weights: smollm2}\n", "spec.model: must not be blank"),
    ("name: chat\nspec: {model: m, weights: smollm2, max_model_len: lots}\n", "spec.max_model_len: Input should be a valid integer"),
    ("name: chat\nspec: {model: m, weights: smollm2, max_num_seqs: -4}\n", "spec.max_num_seqs: Input should be greater than 0"),
    ("name: Chat!\nspec: {model: m, weights: smollm2}\n", "name: must be 1-63 lowercase"),
    ("name: chat\nspec: {model: m, weights: smollm2, dtyp: float32}\n", "spec.dtyp: Extra inputs are not permitted"),
    ("name: [chat\n", "invalid YAML"),
    ("- just\n- a list\n", "expected a mapping"),
]


@pytest.mark.parametrize(("content", "says"), BAD_CLASS_FILES)
def test_bad_class_files_exit_2_with_one_line(fleet: Fleet, tmp_path: Path, content: str, says: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    result = fleet.run("class", "apply", "-f", str(path))
    assert result.exit_code == ExitCode.USAGE
    assert says in one_error_line(result)
    with fleet.client() as client:
        assert client.list_classes() == []


def test_missing_and_oversize_files(fleet: Fleet, tmp_path: Path) -> None:
    missing = fleet.run("class", "apply", "-f", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == ExitCode.USAGE and "No such file" in one_error_line(missing)
    big = tmp_path / "big.yaml"
    big.write_text("name: chat\nspec:\n  model: m\n  weights: smollm2\n  engine_args: {pad: '" + "x" * (1024 * 1024) + "'}\n")
    oversize = fleet.run("class", "apply", "-f", str(big))
    assert oversize.exit_code == ExitCode.USAGE and "larger than 1048576 bytes" in one_error_line(oversize)
    with fleet.client() as client:
        assert client.list_classes() == []


BAD_DEPLOYS = [
    (["--class", "ghost@r1", "--replicas", "1"], "class_ref: unknown replica class 'ghost@r1'"),
    (["--class", "chat@r1", "--replicas", "-2"], "replicas: Input should be greater than or equal to 0"),
    (["--class", " ", "--replicas", "1"], "class_ref: must not be blank"),
    (["--class", "chat@r1", "--replicas", "1", "--role", "both"], "role: Input should be 'mixed', 'prefill' or 'decode'"),
    (["--class", "chat@r1", "--replicas", "1", "--label", "zone"], "--label 'zone': expected KEY=VALUE"),
    (["--class", "chat@r1", "--replicas", "1", "--model", "other"], "model: chat@r1 serves 'smollm2-135m', not 'other'"),
]


@pytest.mark.parametrize(("args", "says"), BAD_DEPLOYS)
def test_bad_deployments_exit_2_and_store_nothing(fleet: Fleet, tmp_path: Path, args: list[str], says: str) -> None:
    fleet.run("class", "apply", "-f", class_file(tmp_path))
    result = fleet.run("deploy", "set", "chat", *args)
    assert result.exit_code == ExitCode.USAGE
    assert says in one_error_line(result)
    with fleet.client() as client:
        assert client.list_deployments() == []


@pytest.mark.parametrize(("args", "code", "says"), [
    (["class", "get", "nope"], ExitCode.NOT_FOUND, "no replica class 'nope'"),
    (["class", "history", "nope"], ExitCode.NOT_FOUND, "no replica class 'nope'"),
    (["node", "cordon", "ghost", "--yes"], ExitCode.NOT_FOUND, "no node 'ghost'"),
    (["engine", "drain", "ghost-0", "--yes"], ExitCode.NOT_FOUND, "no assigned engine 'ghost-0'"),
    (["deploy", "delete", "ghost", "--yes"], ExitCode.NOT_FOUND, "no deployment 'ghost'"),
    (["token", "revoke", "ghost", "--yes"], ExitCode.NOT_FOUND, "no token named 'ghost'"),
    (["audit", "list", "--since", "last week"], ExitCode.USAGE, "since:"),
])
def test_not_found_and_bad_arguments(fleet: Fleet, args: list[str], code: ExitCode, says: str) -> None:
    result = fleet.run(*args)
    assert result.exit_code == code
    assert says in one_error_line(result)


@pytest.mark.parametrize(("role", "args", "says"), [
    ("viewer", ["deploy", "set", "chat", "--class", "chat@r1", "--replicas", "1"], "needs role operator"),
    ("operator", ["token", "list"], "needs role admin"),
    ("agent", ["status"], "needs role viewer"),
    (None, ["status"], "missing bearer token"),
])
def test_auth_failures_exit_4(fleet: Fleet, role: str | None, args: list[str], says: str, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path / "no-state"))  # no local bootstrap token to fall back on
    monkeypatch.delenv("FLEET_TOKEN", raising=False)
    result = fleet.run(*args, role=role)
    assert result.exit_code == ExitCode.AUTH
    assert says in one_error_line(result)


def test_unreachable_controller_exits_6() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    result = CliRunner().invoke(app, ["--controller", url, "--token", "x", "status"])
    assert result.exit_code == ExitCode.UNAVAILABLE
    line = one_error_line(result)
    assert url in line and "unreachable" in line


def test_usage_errors_exit_2() -> None:
    result = CliRunner().invoke(app, ["deploy", "set", "chat", "--replicas", "many"])
    assert result.exit_code == ExitCode.USAGE
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("flags", "says"), [
    (["--locality-weight", "-1"], "locality_weight must be >= 0"),
    (["--hot-spot-factor", "0.5"], "hot_spot_factor must be >= 1"),
    (["--hot-spot-damping", "1.5"], "hot_spot_damping must be <= 1"),
    (["--shared-prefix-requests", "-1"], "shared_prefix_requests must be >= 0"),
    (["--running-cost-steps", "-0.5"], "running_cost_steps must be >= 0"),
    (["--shared-hardware-own-load", "2"], "shared_hardware_own_load must be <= 1"),
])
def test_gateway_serve_refuses_bad_scorer_weights_with_one_line(flags: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["gateway", "serve", "--engines", "http://127.0.0.1:1", *flags])
    assert result.exit_code == ExitCode.USAGE
    assert says in one_error_line(result)


def test_gateway_settings_refuse_a_share_half_life_that_is_not_positive() -> None:
    from fleetctl.gateway.settings import GatewaySettings

    with pytest.raises(ValueError, match="share_half_life_requests_per_engine must be positive"):
        GatewaySettings(static_engines=("http://127.0.0.1:1",), share_half_life_requests_per_engine=0)

"""Each process's command-line options against its settings class: a default lives in one place.

For `controller serve`, `agent serve`, `gateway serve` and `python -m engine.reference`: every option sets
a settings field and has no default of its own (None or argparse.SUPPRESS: the field's default applies), or
is declared not a setting with a reason; every field is set by an option or declared not an option with a
reason; an option's help is its field's description. A refused value is exit 2 and one line naming the field.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import typer.main
from pydantic import BaseModel
from pydantic_core import PydanticUndefined
from typer.testing import CliRunner

from engine.process_settings import SettingsError, field_help
from engine.reference.__main__ import main as engine_main
from engine.reference.cli_args import build_parser
from engine.reference.config import EngineConfig
from fleetctl.cli import agent_cmd, controller_cmd, gateway_cmd
from fleetctl.cli.exit_codes import ExitCode
from fleetctl.cli.main import app
from fleetctl.cli.settings_options import OptionMap
from fleetctl.gateway.settings import GatewaySettings

TYPER_COMMANDS = [
    pytest.param(("controller", "serve"), controller_cmd.SERVE_OPTIONS, id="controller serve"),
    pytest.param(("agent", "serve"), agent_cmd.SERVE_OPTIONS, id="agent serve"),
    pytest.param(("gateway", "serve"), gateway_cmd.SERVE_OPTIONS, id="gateway serve"),
]
ENGINE_PROCESS_OPTIONS = {"help": "argparse's own", "log_level": "how much the process logs"}


def command(path: tuple[str, ...]) -> Any:
    """The click command at `fleetctl PATH...`."""
    found = typer.main.get_command(app)
    for name in path:
        found = found.commands[name]  # type: ignore[attr-defined]
    return found


def options(cmd: Any) -> dict[str, Any]:
    return {param.name: param for param in cmd.params if param.name and param.name != "help"}


def is_required(model: type[BaseModel], field: str) -> bool:
    info = model.model_fields[field]
    return info.default is PydanticUndefined and info.default_factory is None


@pytest.mark.parametrize(("path", "option_map"), TYPER_COMMANDS)
def test_every_option_sets_a_field_and_leaves_its_default_to_it(path: tuple[str, ...], option_map: OptionMap) -> None:
    fields = option_map.settings.model_fields
    for name, param in options(command(path)).items():
        field = option_map.field_of(name)
        if field is None:
            assert option_map.not_settings[name].strip(), name
            continue
        assert field in fields, f"--{name} sets no {option_map.settings.__name__} field"
        assert param.default is None, f"--{name} restates a default ({param.default!r}): leave it to {field}"
        assert not param.required or is_required(option_map.settings, field), f"--{name} required, {field} is not"
        assert fields[field].description and fields[field].description in (param.help or ""), name


@pytest.mark.parametrize(("path", "option_map"), TYPER_COMMANDS)
def test_every_field_is_an_option_or_says_why_not(path: tuple[str, ...], option_map: OptionMap) -> None:
    params = options(command(path))
    set_by_options = {option_map.field_of(name) for name in params} - {None}
    assert set(option_map.not_settings) <= set(params), "not_settings names an option the command lacks"
    assert set(option_map.renamed) <= set(params), "renamed names an option the command lacks"
    assert not set_by_options & set(option_map.not_options), "a field both set by an option and listed as none"
    assert all(reason.strip() for reason in option_map.not_options.values())
    assert set(option_map.settings.model_fields) == set_by_options | set(option_map.not_options)


def test_every_engine_flag_is_a_field_left_to_its_default() -> None:
    actions = {action.dest: action for action in build_parser()._actions}
    for dest, action in actions.items():
        if dest in ENGINE_PROCESS_OPTIONS:
            continue
        assert dest in EngineConfig.model_fields, f"{action.option_strings} sets no EngineConfig field"
        assert action.default is argparse.SUPPRESS, dest
        flag = "--" + dest.replace("_", "-")
        negated = ["--no-" + flag[2:]] if EngineConfig.model_fields[dest].annotation is bool else []
        assert action.option_strings == [flag, *negated]
        assert field_help(EngineConfig, dest) in (action.help or ""), dest
    assert set(EngineConfig.model_fields) <= set(actions)  # the engine has no field without a flag


def test_every_settings_field_is_described() -> None:
    for model in (controller_cmd.ControllerSettings, agent_cmd.AgentSettings, GatewaySettings, EngineConfig):
        for name, info in model.model_fields.items():
            assert info.description and len(info.description) > 10, f"{model.__name__}.{name}"


def test_help_shows_the_fields_default() -> None:
    assert field_help(GatewaySettings, "ttft_slo_s").endswith("(default: 30.0)")
    assert field_help(GatewaySettings, "max_decode_slots").endswith("default the class's max_num_seqs")
    port = next(action for action in build_parser()._actions if action.dest == "port")
    assert port.help == "TCP port the HTTP API listens on (default: 8100)"


def test_settings_refuse_a_value_with_one_line_naming_the_field() -> None:
    with pytest.raises(SettingsError) as caught:
        GatewaySettings(static_engines=("http://127.0.0.1:1",), probe_timeout_s=0)
    assert caught.value.field == "probe_timeout_s"
    assert str(caught.value) == "probe_timeout_s must be positive"
    with pytest.raises(SettingsError, match="^give either a controller URL or a static engine list"):
        GatewaySettings()


@pytest.mark.parametrize(("argv", "says"), [
    (["gateway", "serve", "--engines", "http://127.0.0.1:1", "--probe-timeout-s", "0"], "probe_timeout_s must be positive"),
    (["gateway", "serve", "--engines", "http://127.0.0.1:1", "--max-sessions", "0"], "max_sessions must be positive"),
    (["gateway", "serve", "--engines", "http://127.0.0.1:1", "--port", "70000"], "port must be <= 65535"),
    (["agent", "serve", "--node", "n1", "--tick-s", "0"], "tick_s must be positive"),
    (["agent", "serve", "--node", "n1", "--unhealthy-after", "-1"], "unhealthy_after must be positive"),
    (["controller", "serve", "--token-cache-s", "-1"], "setting token_cache_s must be >= 0"),
])
def test_a_refused_option_is_exit_2_and_one_line(argv: list[str], says: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_STATE_DIR", str(tmp_path))
    result = CliRunner().invoke(app, argv)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == ExitCode.USAGE, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines


@pytest.mark.parametrize(("argv", "says"), [
    (["--port", "70000"], "port must be <= 65535"),
    (["--block-size", "1024"], "max_num_batched_tokens must be at least block_size"),
    (["--keepalive-interval-s", "0"], "keepalive_interval_s must be positive"),
])
def test_a_refused_engine_flag_is_exit_2_and_one_line(argv: list[str], says: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert engine_main(argv) == 2  # before any model loads
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines == [f"python -m engine.reference: error: {says}"]

"""Command-line flags of the reference engine, built from EngineConfig's fields: one flag per field.

`build_parser()` and `config_from_args()` are shared by `python -m engine.reference` and `fleetctl engine
serve`; `add_engine_arguments(parser)` adds the flags to a parser someone else owns. A field `foo_bar` is the
flag `--foo-bar`; its type, choices (a Literal, or REFERENCE_MODELS) and help (the field's description and
default) come from the field, and a boolean field is a `--x/--no-x` pair. A flag left out keeps
EngineConfig's default (argparse.SUPPRESS), so defaults live in one place: engine/reference/config.py.
"""

from __future__ import annotations

import argparse
import os
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from engine.process_settings import field_help
from engine.contract import REFERENCE_MODELS
from engine.reference.config import EngineConfig

API_KEY_ENV = "FLEET_ENGINE_API_KEY"
LOG_LEVELS = ("debug", "info", "warning", "error")
# fields whose choices are not in their type (the names of the loadable models)
_CHOICES: dict[str, tuple[str, ...]] = {"model": REFERENCE_MODELS}
_HELP_SUFFIX = {"api_key": f" (or env {API_KEY_ENV})"}


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _without_none(annotation: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    if get_origin(annotation) in (Union, types.UnionType):
        (inner,) = [arg for arg in get_args(annotation) if arg is not type(None)]
        return inner
    return annotation


def _argument_kwargs(name: str, info: FieldInfo) -> dict[str, Any]:
    """add_argument keyword arguments for one EngineConfig field."""
    annotation = _without_none(info.annotation)
    kwargs: dict[str, Any] = {"help": field_help(EngineConfig, name) + _HELP_SUFFIX.get(name, "")}
    if annotation is bool:
        return {**kwargs, "action": argparse.BooleanOptionalAction}
    if get_origin(annotation) is Literal:
        return {**kwargs, "choices": get_args(annotation)}
    if name in _CHOICES:
        return {**kwargs, "choices": _CHOICES[name]}
    if annotation in (int, float, Path):
        return {**kwargs, "type": annotation}
    return kwargs  # str


def add_engine_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for name, info in EngineConfig.model_fields.items():
        parser.add_argument(flag_name(name), dest=name, default=argparse.SUPPRESS, **_argument_kwargs(name, info))
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.reference", description="Run the fleetctl reference engine (OpenAI-compatible API)."
    )
    add_engine_arguments(parser)
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS, help="how much the process logs")
    return parser


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from parsed flags; unset flags keep EngineConfig's defaults. Raises SettingsError."""
    values = {k: v for k, v in vars(args).items() if k in EngineConfig.model_fields}
    if "api_key" not in values and os.environ.get(API_KEY_ENV):
        values["api_key"] = os.environ[API_KEY_ENV]
    return EngineConfig(**values)


def config_fields_without_flag() -> set[str]:
    """EngineConfig fields no flag sets (a test keeps this empty)."""
    flags = {action.dest for action in build_parser()._actions}
    return set(EngineConfig.model_fields) - flags

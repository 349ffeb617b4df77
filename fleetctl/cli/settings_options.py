"""Typer options for settings fields: help text from the field, and no default of their own.

An option made by `setting_option(Model, "field", "--flag")` defaults to None and shows the field's
description and default in `--help`; `given(...)` keeps only the options set on the command line, so a field
left unset keeps the settings class's default: each default lives in one place, the settings class.

Each `serve` command declares an `OptionMap`: which settings field each option sets, which options are not
settings (and why), and which fields no option sets (and why). tests/test_settings_options.py checks every
map against its command and its settings class, so a new field or option cannot be left out silently.
Only the settings modules are imported for this (pydantic, no server code).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import typer
from pydantic import BaseModel

from engine.process_settings import SettingsError, field_help
from fleetctl.errors import ValidationFailed


@dataclass(frozen=True)
class OptionMap:
    """How one command's options relate to its settings class."""

    settings: type[BaseModel]
    renamed: Mapping[str, str]  # option parameter -> the settings field it sets, where the names differ
    not_settings: Mapping[str, str]  # option parameter -> why it is not a settings field
    not_options: Mapping[str, str]  # settings field -> why no option sets it

    def field_of(self, parameter: str) -> str | None:
        """The settings field an option parameter sets, or None for an option that is not a setting."""
        if parameter in self.not_settings:
            return None
        return self.renamed.get(parameter, parameter)


def setting_option(model: type[BaseModel], field: str, *flags: str, default_text: str | None = None,
                   help_prefix: str = "", help_suffix: str = "", **kwargs: Any) -> Any:
    """A typer option for `field` of `model` (give it the default None in the signature). `default_text` is
    what the command uses when the option is not given, where that is not the field's own default;
    `help_prefix` says how the option's value becomes the field's (e.g. "file holding the "); `help_suffix`
    adds what the command knows and the field does not (e.g. the environment variable it also reads)."""
    text = help_prefix + field_help(model, field, default_text) + help_suffix
    return typer.Option(*flags, help=text, show_default=False, **kwargs)


def given(**options: Any) -> dict[str, Any]:
    """The options set on the command line (not None), to pass to a settings class."""
    return {name: value for name, value in options.items() if value is not None}


def build_settings(model: type[BaseModel], values: Mapping[str, Any]) -> Any:
    """`model(**values)`, a refused value becoming the CLI's usage error (exit 2, one line naming the field)."""
    try:
        return model(**values)
    except SettingsError as exc:
        raise ValidationFailed(exc.message, field=exc.field) from None

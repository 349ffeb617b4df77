"""What every process's settings class shares (controller, agent, gateway, reference engine).

Each process has one settings class, a `ProcessSettings`: frozen, built once, refusing a bad value with a
`SettingsError` (a ValueError naming the field, in one line). Each field's description says what the
field is and its unit; where the default is not a plain value (None, or computed when the process starts)
the description also says what the default means. Command-line options are built from these fields or
checked against them (tests/test_settings_options.py), so a default lives only in the settings class.

- `ProcessSettings`, `SettingsError`: the base class and its one error.
- `field_help(model, name)`: an option's help text: the field's description, then its plain default.
- `settings_problem(error)`: the first refused value of a ValidationError as (field, one readable line).

Only pydantic is imported here, so any process (and the CLI, before it loads a package) can use it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticUndefined


def _bound(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)  # 1.0 -> "1", as the field was declared


_CONSTRAINT_PHRASES = {
    "greater_than": lambda ctx: "must be positive" if ctx["gt"] == 0 else f"must be > {_bound(ctx['gt'])}",
    "greater_than_equal": lambda ctx: f"must be >= {_bound(ctx['ge'])}",
    "less_than": lambda ctx: f"must be < {_bound(ctx['lt'])}",
    "less_than_equal": lambda ctx: f"must be <= {_bound(ctx['le'])}",
    "string_too_short": lambda ctx: "must not be empty" if ctx["min_length"] == 1
    else f"must be at least {ctx['min_length']} characters",
}
_VALUE_ERROR_PREFIX = "Value error, "


class SettingsError(ValueError):
    """A refused settings value: the field at fault (None for a rule across fields) and one readable line."""

    def __init__(self, field: str | None, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


class ProcessSettings(BaseModel):
    """Base of every process's settings class: frozen; a refused value raises SettingsError, not pydantic's
    multi-line ValidationError, so a command line or a log shows one line naming the field."""

    model_config = ConfigDict(frozen=True)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise SettingsError(*settings_problem(exc)) from None


def plain_default(model: type[BaseModel], name: str) -> Any:
    """The field's default when it is a plain value; None when it is None, computed, or the field is required."""
    info = model.model_fields[name]
    return None if info.default is PydanticUndefined else info.default


def field_help(model: type[BaseModel], name: str, default_text: str | None = None) -> str:
    """The field's description, with `(default: X)` when the default is a plain, non-empty value, or with
    `default_text` (what a command uses when the option is not given, e.g. a global option).

    Round brackets, not square ones: typer's rich help would read `[default: X]` as markup and drop it.
    """
    description = model.model_fields[name].description or ""
    default = default_text if default_text is not None else plain_default(model, name)
    if default is None or default in ((), {}, []):  # the description says what no value means
        return description
    return f"{description} (default: {default})"


def settings_problem(error: ValidationError) -> tuple[str | None, str]:
    """(the field at fault or None, one line saying what is wrong) for the first error of `error`."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or None
    message = " ".join(first["msg"].split()).removeprefix(_VALUE_ERROR_PREFIX)
    phrase = _CONSTRAINT_PHRASES.get(first["type"])
    if phrase is not None:
        message = phrase(first.get("ctx") or {})
    if field is None:
        return None, message
    return field, f"{field} {message}" if message.startswith("must") else f"{field}: {message}"

"""Output: data on stdout as `-o table|json|yaml`, status and progress on stderr.

Every command that reads takes `-o/--output` through one of the options below, so a script can ask any of
them for JSON; tests/cli/test_cli_consistency.py holds the list of reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any

import typer
import yaml
from pydantic import BaseModel


class Format(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


OutputOption = Annotated[Format, typer.Option("--output", "-o", help="output format: table, json or yaml")]
DetailOutputOption = Annotated[Format, typer.Option("--output", "-o", help="output format: yaml (default), json or table")]
JsonOutputOption = Annotated[Format, typer.Option("--output", "-o", help="output format: json (default), yaml or table")]


@dataclass(frozen=True)
class Column:
    header: str
    value: Callable[[dict[str, Any]], Any]


def col(header: str, key: str) -> Column:
    return Column(header, lambda row: row.get(key))


def status(message: str) -> None:
    """A status line for the human (stderr), never mixed into data."""
    typer.echo(message, err=True)


def to_plain(data: Any) -> Any:
    """The JSON form of the client's response models (and of lists and dicts of them); other data as it is."""
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json", by_alias=True)
    if isinstance(data, list):
        return [to_plain(item) for item in data]
    if isinstance(data, dict):
        return {key: to_plain(value) for key, value in data.items()}
    return data


def emit(data: Any, fmt: Format, columns: Sequence[Column] | None = None) -> None:
    """Print `data` (response models or plain data) on stdout. Tables need `columns` (data: a row or a list
    of rows; columns read the rows' JSON form); else YAML is used."""
    data = to_plain(data)
    if fmt is Format.json:
        typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))
    elif fmt is Format.yaml or columns is None:
        typer.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
    else:
        rows = data if isinstance(data, list) else [data]
        typer.echo(table(rows, columns))


def table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    cells = [[c.header for c in columns]] + [[_cell(c.value(row)) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in cells)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "-"
    return str(value)

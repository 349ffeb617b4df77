"""Picking a value out of a command's `-o json` output: `deployments.0.ready`, `engines.*.state` (the list of
every element's state), `nodes.#` (a length), `` (the whole document)."""

from __future__ import annotations

from typing import Any


class PathMissing(LookupError):
    """The document has nothing at the path (one readable line)."""


def problem(path: str) -> str | None:
    """Why `path` is malformed, or None."""
    if path and any(part == "" for part in path.split(".")):
        return f"path {path!r} has an empty part (write a.b.0, not a..b)"
    return None


def pick(document: Any, path: str) -> Any:
    return _pick(document, path.split(".") if path else [], path)


def _pick(value: Any, parts: list[str], path: str) -> Any:
    if not parts:
        return value
    head, rest = parts[0], parts[1:]
    if head == "#":
        if not isinstance(value, (list, dict, str)):
            raise PathMissing(f"{path}: '#' needs a list, mapping or string, got {_kind(value)}")
        return _pick(len(value), rest, path)
    if head == "*":
        items = list(value.values()) if isinstance(value, dict) else value
        if not isinstance(items, list):
            raise PathMissing(f"{path}: '*' needs a list or mapping, got {_kind(value)}")
        return [_pick(item, rest, path) for item in items]
    return _pick(_step(value, head, path), rest, path)


def _step(value: Any, head: str, path: str) -> Any:
    if isinstance(value, dict):
        if head not in value:
            raise PathMissing(f"{path}: no {head!r} (keys: {', '.join(map(str, list(value)[:10])) or 'none'})")
        return value[head]
    if isinstance(value, list):
        try:
            return value[int(head)]
        except ValueError:
            raise PathMissing(f"{path}: {head!r} is not an index into a list") from None
        except IndexError:
            raise PathMissing(f"{path}: index {head} out of range (the list has {len(value)})") from None
    raise PathMissing(f"{path}: {_kind(value)} has no {head!r}")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__

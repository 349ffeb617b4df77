"""The golden-set file format: load a YAML or JSONL file into `types.GoldenSet`, refuse a bad one with one line
that names the entry and the field, and check a set against the class revision it is about to be recorded on.

YAML: a mapping of the header fields (name, version, model, description, p0_floor, tolerance) and `prompts`, a
list of prompts. JSONL: the first line is the header fields, each further line one prompt. A prompt is a chat
(`messages`: [{role, content}]) or a completion (`prompt`), never both; sampling is fixed (greedy, or seeded:
a temperature above 0 needs a seed, so every run of a prompt draws the same tokens); `expected` is an exact
answer or a regex.

    golden set smollm2.yaml: prompts[3] (id 'sum-small'): messages and prompt are exclusive

`golden/` ships sets for SmolLM2 (`smollm2`, and its short-answer prompts `smollm2-quick`) and the tiny test model
(`tiny`): `shipped_golden(name)`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fleetctl.canary.types import GoldenPrompt, GoldenSet
from fleetctl.errors import ValidationFailed
from fleetctl.replica_class import ReplicaClassSpec

SHIPPED_DIR = Path(__file__).parent / "golden"
CHAT_ROLES = frozenset({"system", "user", "assistant"})
MESSAGE_KEYS = frozenset({"role", "content"})


class GoldenSetError(ValidationFailed):
    """A golden set that cannot be used, as one line naming the file (or set), the entry and the field.
    A ValidationFailed: the API answers 422 and the CLI exits 2 (usage)."""

    code = "invalid_golden_set"


# --- loading ----------------------------------------------------------------------------------------------------

def load_golden(path: Path) -> GoldenSet:
    """Read and validate a golden-set file (.jsonl: JSON lines; anything else: YAML)."""
    source = path.name
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GoldenSetError(f"golden set {source}: cannot be read ({_reason(exc)})", field="file") from None
    if not text.strip():
        raise GoldenSetError(f"golden set {source}: the file is empty", field="file")
    document = _jsonl_document(text, source) if path.suffix == ".jsonl" else _yaml_document(text, source)
    return parse_golden(document, source)


def shipped_golden(name: str) -> Path:
    """The file of a golden set shipped with fleetctl: 'smollm2', 'smollm2-quick' or 'tiny' (with or without '.yaml')."""
    stem = name.removesuffix(".yaml")
    path = SHIPPED_DIR / f"{stem}.yaml"
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", stem) or not path.is_file():
        raise GoldenSetError(f"no shipped golden set {name!r}; shipped: {', '.join(shipped_golden_names())}",
                             field="golden")
    return path


def shipped_golden_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED_DIR.glob("*.yaml"))


def _yaml_document(text: str, source: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise GoldenSetError(f"golden set {source}: invalid YAML ({' '.join(str(exc).split())})",
                             field="file") from None


def _jsonl_document(text: str, source: str) -> dict[str, Any]:
    """{**header, prompts: [...]} from JSON lines (blank lines skipped)."""
    rows: list[Any] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            raise GoldenSetError(f"golden set {source}: line {number}: invalid JSON ({exc})", field="file") from None
    header = rows[0]
    if not isinstance(header, dict):
        raise GoldenSetError(f"golden set {source}: the first line must be the header (name, version, model, ...)",
                             field="file")
    if "prompts" in header:
        raise GoldenSetError(f"golden set {source}: the header line must not hold prompts (one prompt per line)",
                             field="prompts")
    return {**header, "prompts": rows[1:]}


# --- validation -------------------------------------------------------------------------------------------------

def parse_golden(document: Any, source: str) -> GoldenSet:
    """A golden set from its plain form (a parsed file, an API body), checked whole. `source` names it in
    errors (the file name)."""
    where = f"golden set {source}"
    if not isinstance(document, dict):
        raise GoldenSetError(f"{where}: expected a mapping of name, version, model, prompts", field="file")
    raw_prompts = document.get("prompts")
    if raw_prompts is None or raw_prompts == []:
        raise GoldenSetError(f"{where}: prompts: the set has no prompts", field="prompts")
    if not isinstance(raw_prompts, list):
        raise GoldenSetError(f"{where}: prompts: must be a list of prompts", field="prompts")
    prompts = [_prompt(raw, index, where) for index, raw in enumerate(raw_prompts)]
    _unique_ids(prompts, where)
    try:
        return GoldenSet.model_validate({**document, "prompts": prompts})
    except ValidationError as exc:
        loc, message = _first_error(exc)
        raise GoldenSetError(f"{where}: {_dotted(loc)}: {message}", field=_field(loc)) from None


def _prompt(raw: Any, index: int, where: str) -> GoldenPrompt:
    entry = _entry(raw, index)
    if not isinstance(raw, dict):
        raise GoldenSetError(f"{where}: {entry}: must be a mapping (id, messages or prompt, sampling, ...)",
                             field=f"prompts.{index}")
    try:
        prompt = GoldenPrompt.model_validate(raw)
    except ValidationError as exc:
        loc, message = _first_error(exc)
        raise GoldenSetError(f"{where}: {entry}: {_dotted(loc)}: {message}",
                             field=_field(("prompts", index, *loc))) from None
    problem = _prompt_problem(prompt)
    if problem is not None:
        field, message = problem
        raise GoldenSetError(f"{where}: {entry}: {message}", field=f"prompts.{index}.{field}")
    return prompt


def _prompt_problem(prompt: GoldenPrompt) -> tuple[str, str] | None:
    """(field, message) of the first thing wrong with a prompt the model accepted; None when it is usable."""
    if (prompt.messages is None) == (prompt.prompt is None):
        return ("messages", "messages and prompt are exclusive" if prompt.messages is not None
                else "needs messages (chat) or prompt (completion)")
    if prompt.messages is not None:
        if not prompt.messages:
            return "messages", "messages: must not be empty"
        for i, message in enumerate(prompt.messages):
            if set(message) != MESSAGE_KEYS:
                return f"messages.{i}", f"messages[{i}]: needs exactly role and content, has {sorted(message)}"
            if message["role"] not in CHAT_ROLES:
                return (f"messages.{i}.role", f"messages[{i}].role: {message['role']!r} is not one of "
                        f"{', '.join(sorted(CHAT_ROLES))}")
    elif not (prompt.prompt or "").strip():
        return "prompt", "prompt: must not be empty"
    if prompt.sampling.temperature > 0 and prompt.sampling.seed is None:
        return "sampling.seed", "sampling.seed: required when temperature > 0 (every run must draw the same tokens)"
    expected = prompt.expected
    if expected is not None:
        if (expected.exact is None) == (expected.regex is None):
            return "expected", "expected: give exactly one of exact or regex"
        if expected.regex is not None:
            try:
                re.compile(expected.regex)
            except re.error as exc:
                return "expected.regex", f"expected.regex: does not compile ({exc})"
    return None


def _unique_ids(prompts: list[GoldenPrompt], where: str) -> None:
    seen: dict[str, int] = {}
    for index, prompt in enumerate(prompts):
        if prompt.id in seen:
            raise GoldenSetError(f"{where}: prompts[{index}] (id {prompt.id!r}): id: duplicates prompts[{seen[prompt.id]}]",
                                 field=f"prompts.{index}.id")
        seen[prompt.id] = index


# --- against a class --------------------------------------------------------------------------------------------

def check_against_class(golden: GoldenSet, spec: ReplicaClassSpec, served_model: str,
                        prompt_tokens: Mapping[str, int], *, source: str | None = None) -> None:
    """Refuse a set for another model than the class serves, and any prompt whose prompt tokens plus its
    max_tokens do not fit in the class's context window. `prompt_tokens`: prompt id -> tokens as the serving
    path counts them (chat template included)."""
    check_model(golden, served_model, source=source)
    where = f"golden set {source or golden.name}"
    for index, prompt in enumerate(golden.prompts):
        entry = _entry(prompt.model_dump(), index)
        tokens = prompt_tokens.get(prompt.id)
        if tokens is None:
            raise GoldenSetError(f"{where}: {entry}: its prompt tokens were not counted", field=f"prompts.{index}")
        total = tokens + prompt.sampling.max_tokens
        if total > spec.max_model_len:
            raise GoldenSetError(
                f"{where}: {entry}: {tokens} prompt tokens + max_tokens {prompt.sampling.max_tokens} = {total} "
                f"exceed the class's context window of {spec.max_model_len}", field=f"prompts.{index}")


def check_model(golden: GoldenSet, served_model: str, *, source: str | None = None) -> None:
    """The model half of check_against_class, which needs no token counts (so it can come first)."""
    if golden.model != served_model:
        raise GoldenSetError(f"golden set {source or golden.name}: model: the set is for {golden.model!r}, the class "
                             f"serves {served_model!r}", field="model")


def golden_digest(golden: GoldenSet) -> str:
    """sha256 of the set's canonical JSON (sorted keys, no spaces): the same content, the same digest."""
    canonical = json.dumps(golden.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


# --- naming things ----------------------------------------------------------------------------------------------

def _entry(raw: Any, index: int) -> str:
    ident = raw.get("id") if isinstance(raw, dict) else None
    return f"prompts[{index}] (id {ident!r})" if isinstance(ident, str) and ident else f"prompts[{index}]"


def _first_error(exc: ValidationError) -> tuple[tuple[Any, ...], str]:
    error = exc.errors()[0]
    kind, message = error.get("type", ""), str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        message = "unknown field"
    elif kind == "missing":
        message = "required"
    return tuple(error.get("loc", ())), message


def _dotted(loc: tuple[Any, ...]) -> str:
    """('messages', 0, 'role') -> 'messages[0].role'."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(set)"


def _field(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__

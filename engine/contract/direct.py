"""Direct (break-glass) actions: what an agent or a gateway did on an operator's say-so without the controller.

Each node keeps its own record, the direct-action journal: an append-only JSON-lines file, one `DirectAction`
per line, each line flushed and fsynced before the action's reply goes out, so a crash right after a drain
still shows the drain. A second small file holds the highest sequence number the controller has
acknowledged (`uploaded`); everything after it is uploaded on the next exchange with the controller.

The break-glass credential is a per-node secret, separate from the controller's tokens: it lives in a file
on the node (written at enrolment, rotatable) and is compared in constant time. One node's credential means
nothing to another node, so a leaked credential opens one node.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.contract.bounds import Count, FreeText, SafeJson, ShortText

SourceKind = Literal["agent", "gateway"]
Resolution = Literal["adopted", "reverted", "matches"]
CREDENTIAL_BYTES = 24
UNIX_YEAR_3000 = 32_503_680_000.0  # a timestamp past this is a broken clock, not a time
JOURNAL_FILE = "direct-actions.jsonl"
UPLOADED_FILE = "direct-actions.uploaded"


class DirectAction(BaseModel):
    """One direct action as the node did it. `target` is an engine (agent) or a flag key (gateway);
    `value` the flag's new value (None: the override was removed) or None for an engine action."""

    model_config = ConfigDict(extra="forbid")

    seq: Count = Field(description="1, 2, ... per node: the journal's line number")
    at: float = Field(ge=0, le=UNIX_YEAR_3000, allow_inf_nan=False, description="when the node did it, Unix seconds")
    action: ShortText = Field(description="drain, stop, restart (agent); flag.set, flag.unset (gateway)")
    target: ShortText
    value: SafeJson = None
    reason: FreeText | None = None
    client: ShortText | None = Field(default=None, description="the address the request came from")


class DirectUpload(BaseModel):
    """A node's upload: its new journal entries, and the sequence numbers of its direct holds still in force
    (an agent's drained engine, a gateway's local override), whose resolution it asks for."""

    model_config = ConfigDict(extra="forbid")

    kind: SourceKind
    source: ShortText = Field(description="the node (agent) or gateway name")
    actions: list[DirectAction] = Field(default_factory=list, max_length=1000)
    open: list[Count] = Field(default_factory=list, max_length=1000)


class DirectUploadReply(BaseModel):
    acknowledged: Count = Field(description="the highest sequence number the controller now holds")
    resolved: dict[str, Resolution] = Field(default_factory=dict, description="seq -> how the operator resolved it")


class DirectJournal:
    """The node's append-only journal of direct actions (see the module doc)."""

    def __init__(self, directory: Path):
        self.path = directory / JOURNAL_FILE
        self.uploaded_path = directory / UPLOADED_FILE
        directory.mkdir(parents=True, exist_ok=True)
        self._entries = self._read()

    def _read(self) -> list[DirectAction]:
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        entries = []
        for index, line in enumerate(lines):
            try:
                entries.append(DirectAction.model_validate_json(line))
            except ValueError:
                if index < len(lines) - 1:
                    raise
                # the last line cut short by a crash mid-write: its reply never went out, nothing acted on it
        return entries

    def entries(self) -> list[DirectAction]:
        return list(self._entries)

    def append(self, action: str, target: str, value: Any = None, reason: str | None = None,
               client: str | None = None, now: float | None = None) -> DirectAction:
        entry = DirectAction(seq=len(self._entries) + 1, at=time.time() if now is None else now, action=action,
                             target=target, value=value, reason=reason, client=client)
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(entry.model_dump_json() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self._entries.append(entry)
        return entry

    def uploaded(self) -> int:
        try:
            return int(self.uploaded_path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def pending(self) -> list[DirectAction]:
        done = self.uploaded()
        return [e for e in self._entries if e.seq > done]

    def mark_uploaded(self, seq: int) -> None:
        write_atomically(self.uploaded_path, str(seq))


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Replace `path` with `text`: a temporary file, fsynced, renamed over it."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def ensure_credential(path: Path) -> str:
    """The node's break-glass credential from `path`, written (0600) on first use."""
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        value = ""
    if not value:
        path.parent.mkdir(parents=True, exist_ok=True)
        value = new_credential()
        write_atomically(path, value + "\n", mode=0o600)
    return value


def new_credential() -> str:
    return "bg_" + secrets.token_urlsafe(CREDENTIAL_BYTES)


def bearer_problem(header: str | None, expected: str) -> str | None:
    """Why the Authorization header does not carry `expected` (None: it does). Constant time in the token."""
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return "direct actions need 'Authorization: Bearer <break-glass credential>'"
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        return "the break-glass credential is not valid for this node"
    return None


def load_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return default

"""Does an engine hash prefixes as the gateway does? Checked from its own KV events. Pure, no I/O.

The gateway routes by the hashes it computes for a prompt's blocks (engine.hashing, with its seed). An engine
started with another seed (a stock vLLM with PYTHONHASHSEED set, a fleet that kept the old default "0") holds
the same blocks under other hashes, so the index never matches it and prefix routing silently stops working
for it. Its KV events show it: a `BlockStored` whose parent is None is the first block of a chain, and its
hash depends only on the seed and the block's tokens, both in the event. So for each such block the gateway
computes the hash itself and compares.

- A block whose hash matches proves the seed (a 64-bit match by chance is out of the question): the engine is
  `match` from then on, whatever follows.
- MISMATCHES_TO_FLAG root blocks in a row that do not match, and none that did, make it `hash_mismatch`.
- Other blocks cannot be checked (their parent is only known by its 64-bit form, not the full digest the
  chain needs), nor can blocks with extra keys (a LoRA adapter's name is part of their hash) or an event whose
  tokens do not fill its first block. An engine with nothing checked yet is `unchecked`.
The engine's record starts again when it restarts (the subscriber resets it with the index).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.hashing import hash_block_tokens, to_int64
from engine.kv_events import BlockStored, EventBatch

HashStatus = Literal["match", "hash_mismatch", "unchecked"]
MISMATCHES_TO_FLAG = 3  # root blocks in a row that do not match; one could be an event the engine got wrong


def root_block_matches(event: BlockStored, seed: str) -> bool | None:
    """Whether the engine's hash of a chain's first block is the one `seed` gives; None: not checkable."""
    if event.parent_block_hash is not None or not event.block_hashes:
        return None
    if event.lora_id is not None or event.lora_name is not None:
        return None
    size = event.block_size
    if size <= 0 or len(event.token_ids) < size:
        return None
    expected = to_int64(hash_block_tokens(None, event.token_ids[:size], None, seed))
    return event.block_hashes[0] == expected


@dataclass
class EngineHashRecord:
    checked: int = 0
    matched: int = 0
    mismatches_in_a_row: int = 0

    @property
    def status(self) -> HashStatus:
        if self.matched:
            return "match"
        if self.mismatches_in_a_row >= MISMATCHES_TO_FLAG:
            return "hash_mismatch"
        return "unchecked"


class HashChecks:
    """Per engine, what its root blocks said about its seed."""

    def __init__(self, seed: str) -> None:
        self.seed = seed
        self._records: dict[str, EngineHashRecord] = {}

    def observe(self, engine: str, batch: EventBatch) -> None:
        record = self._records.setdefault(engine, EngineHashRecord())
        for event in batch.events:
            if not isinstance(event, BlockStored):
                continue
            matches = root_block_matches(event, self.seed)
            if matches is None:
                continue
            record.checked += 1
            if matches:
                record.matched += 1
                record.mismatches_in_a_row = 0
            else:
                record.mismatches_in_a_row += 1

    def status(self, engine: str) -> HashStatus:
        record = self._records.get(engine)
        return record.status if record is not None else "unchecked"

    def record(self, engine: str) -> EngineHashRecord:
        return self._records.get(engine, EngineHashRecord())

    def reset(self, engine: str) -> None:
        self._records.pop(engine, None)

    def mismatched(self) -> list[str]:
        return sorted(name for name, record in self._records.items() if record.status == "hash_mismatch")

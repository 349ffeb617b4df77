"""Turn a request into the token ids the engine will see, and those into prefix block hashes.

The gateway must tokenise exactly as the engine does, or its block hashes will never match the engines' KV
events: chat messages go through the tokenizer's chat template (`apply_chat_template(..., tokenize=False)`
then `encode(text, add_special_tokens=False)`), a text prompt through `encode(prompt)` (special tokens
added), and a prompt given as token ids is used as is. Hashes: `engine.hashing.block_hashes_int64` with the
class's block size and the fleet's seed.

Tokenizers are loaded once per class, off the event loop:
- reference-engine classes (weights in engine.contract.REFERENCE_MODELS, which share the SmolLM2 tokenizer):
  from the engine's on-disk cache (engine.contract.smollm2_cache_dir; FLEET_CACHE_DIR), never loading model
  weights and never importing the engine;
- vLLM classes: `transformers.AutoTokenizer` for the class's tokenizer (or weights) from local files;
- when neither is available: the engines' own `POST /tokenize` (vLLM and the reference engine have it),
  which costs a round trip per request but is always consistent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from engine.contract import REFERENCE_MODELS, smollm2_cache_dir
from engine.hashing import block_hashes_int64
from fleetctl.gateway.errors import NoRoute
from fleetctl.replica_class import ReplicaClassSpec

log = logging.getLogger(__name__)

class PromptTokenizer(Protocol):
    async def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]: ...

    async def text(self, prompt: str) -> list[int]: ...


INLINE_MAX_CHARS = 2048  # shorter prompts are encoded on the event loop (~0.1 ms); a thread hop costs more


class LocalTokenizer:
    """A Hugging Face tokenizer in this process. Long prompts are encoded in a worker thread so the event loop
    keeps relaying other streams; short ones inline, where the hop to a thread would cost more than encoding."""

    def __init__(self, tokenizer: Any, source: str):
        self.tokenizer = tokenizer
        self.source = source
        # A fast tokenizer's Rust backend gives the ids `tokenizer.encode` gives, without transformers' Python
        # wrapper around it: ~20% of a short prompt's encode, and the gateway's added latency is its CPU.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
        return self.encode(text, add_special_tokens=False)

    async def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        if sum(len(str(m.get("content") or "")) for m in messages) <= INLINE_MAX_CHARS:
            return self._chat(messages, add_generation_prompt)
        return await asyncio.to_thread(self._chat, messages, add_generation_prompt)

    async def text(self, prompt: str) -> list[int]:
        if len(prompt) <= INLINE_MAX_CHARS:
            return self._text(prompt)
        return await asyncio.to_thread(self._text, prompt)

    def _text(self, prompt: str) -> list[int]:
        return self.encode(prompt, add_special_tokens=True)


class RemoteTokenizer:
    """POST /tokenize on one of the class's engines (the first that answers)."""

    def __init__(self, client: httpx.AsyncClient, model: str, engine_urls: Callable[[], Sequence[str]], timeout_s: float = 5.0):
        self.client = client
        self.model = model
        self.engine_urls = engine_urls
        self.timeout_s = timeout_s
        self.source = "engine /tokenize"

    async def _tokenize(self, body: dict[str, Any]) -> list[int]:
        errors = []
        for url in self.engine_urls():
            try:
                response = await self.client.post(f"{url}/tokenize", json={"model": self.model, **body}, timeout=self.timeout_s)
                if response.status_code == 200:
                    return list(response.json()["tokens"])
                errors.append(f"{url}: HTTP {response.status_code}")
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                errors.append(f"{url}: {type(exc).__name__}")
        raise NoRoute(f"cannot tokenise for model {self.model!r}: no engine answered /tokenize ({'; '.join(errors) or 'no engine'})")

    async def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        return await self._tokenize({"messages": messages, "add_generation_prompt": add_generation_prompt})

    async def text(self, prompt: str) -> list[int]:
        return await self._tokenize({"prompt": prompt})


def load_local_tokenizer(spec: ReplicaClassSpec, cache_dir: Path | None) -> LocalTokenizer | None:
    """The class's tokenizer from local files, or None when there is none. Never loads model weights."""
    from transformers import AutoTokenizer

    if spec.backend == "reference" and spec.weights in REFERENCE_MODELS and spec.tokenizer is None:
        path = smollm2_cache_dir(cache_dir)
        if not (path / "tokenizer.json").exists():
            log.warning("no cached SmolLM2 tokenizer at %s (start an engine once to build it)", path)
            return None
        return LocalTokenizer(AutoTokenizer.from_pretrained(path), str(path))
    source = spec.tokenizer or spec.weights
    try:
        return LocalTokenizer(AutoTokenizer.from_pretrained(source, local_files_only=True), source)
    except Exception as exc:  # not downloaded, not a tokenizer, or no network: use the engines' /tokenize
        log.warning("tokenizer %s not available locally (%s); using the engines' /tokenize", source, type(exc).__name__)
        return None


@dataclass(frozen=True)
class TokenizerKey:
    backend: str
    weights: str
    tokenizer: str | None

    @classmethod
    def of(cls, spec: ReplicaClassSpec) -> "TokenizerKey":
        weights = "smollm2" if spec.backend == "reference" and spec.weights in REFERENCE_MODELS else spec.weights
        return cls(spec.backend, weights, spec.tokenizer)


class Tokenizers:
    """One tokenizer per distinct (backend, weights, tokenizer), loaded once, in a thread."""

    def __init__(self, client: httpx.AsyncClient, cache_dir: Path | None = None,
                 loader: Callable[[ReplicaClassSpec, Path | None], PromptTokenizer | None] = load_local_tokenizer):
        self.client = client
        self.cache_dir = cache_dir
        self.loader = loader
        self._local: dict[TokenizerKey, asyncio.Task] = {}

    def preload(self, spec: ReplicaClassSpec) -> asyncio.Task:
        key = TokenizerKey.of(spec)
        if key not in self._local:
            self._local[key] = asyncio.create_task(asyncio.to_thread(self.loader, spec, self.cache_dir))
        return self._local[key]

    async def get(self, model: str, spec: ReplicaClassSpec, engine_urls: Callable[[], Sequence[str]]) -> PromptTokenizer:
        try:
            local = await asyncio.shield(self.preload(spec))
        except Exception as exc:
            log.warning("loading the tokenizer of %s failed: %r", model, exc)
            local = None
        return local if local is not None else RemoteTokenizer(self.client, model, engine_urls)

    async def close(self) -> None:
        for task in self._local.values():
            task.cancel()


def prompt_block_hashes(token_ids: Sequence[int], block_size: int, seed: str) -> list[int]:
    return block_hashes_int64(token_ids, block_size, seed)

"""The gateway tokenises exactly as the engine does: the Rust backend path gives `tokenizer.encode`'s ids."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from engine.contract import default_cache_dir
from engine.reference.weights import ensure_smollm2_cache
from fleetctl.gateway.tokenization import LocalTokenizer

TEXTS = [
    "The capital of France is",
    "  leading spaces, trailing spaces  ",
    "unicode: café, naïve, 東京, emoji 🙂, math ∑x²",
    "line one\nline two\r\n\ttabbed",
    "<|im_start|>user\nspecial tokens in the text<|im_end|>",
    "",
    "a" * 3000,  # past the inline limit: encoded in a thread, same ids
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(ensure_smollm2_cache(default_cache_dir()))


@pytest.mark.parametrize("text", TEXTS)
async def test_text_prompts_match_the_tokenizers_own_encode(tokenizer, text: str) -> None:
    local = LocalTokenizer(tokenizer, "smollm2")
    assert local._backend is not None  # the fast path is the one under test
    assert await local.text(text) == tokenizer.encode(text, add_special_tokens=True)


async def test_chat_prompts_match_the_template_then_encode(tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
    expected = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                                add_special_tokens=False)
    assert await LocalTokenizer(tokenizer, "smollm2").chat(messages, add_generation_prompt=True) == expected


async def test_a_tokenizer_without_a_rust_backend_uses_its_own_encode(tokenizer) -> None:
    class Slow:
        def encode(self, text: str, add_special_tokens: bool) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=add_special_tokens)

    local = LocalTokenizer(Slow(), "slow")
    assert local._backend is None and await local.text(TEXTS[0]) == tokenizer.encode(TEXTS[0])

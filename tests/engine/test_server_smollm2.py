"""The real model through the API: SmolLM2-135M-Instruct knows the capital of France."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france(launch_engine) -> None:
    engine = launch_engine("--model", "smollm2", "--kv-cache-mib", "64", "--num-threads", "2")
    response = engine.post("/v1/chat/completions", {
        "model": "smollm2-135m",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 32,
        "temperature": 0,
    })
    assert response.status_code == 200, response.text
    body = response.json()
    assert "Paris" in body["choices"][0]["message"]["content"]
    assert body["model"] == "smollm2-135m" and body["usage"]["completion_tokens"] <= 32

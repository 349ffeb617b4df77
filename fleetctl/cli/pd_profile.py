"""`fleetctl pd profile CLASS_REF`: measure one engine of a class revision and store its profile.

The sweep talks to the engine directly (its URL from the controller), not through a gateway, so routing
and P/D handoffs do not enter the figures; run it on an engine that takes no other traffic (cordon it, or
profile before the class gets traffic). Each prompt starts with random words, so no prefix-cache hit
makes prefill look cheaper than it is. Figures fitted by fleetctl.pd.profile.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict
from typing import Annotated, Any

import httpx
import typer

from fleetctl.cli.context import ReasonOption, client
from fleetctl.cli.output import Format, OutputOption, emit, status
from fleetctl.errors import FleetError, NotFound
from fleetctl.pd.profile import DecodePoint, PrefillPoint, fit, p90

WORDS = ("river", "stone", "cloud", "maple", "copper", "lantern", "harbor", "violet", "meadow", "signal", "ember",
         "quartz", "willow", "falcon", "cinder", "orbit")
ROUNDS = 2


def _prompt(words: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def _prefill_round(http: httpx.AsyncClient, url: str, model: str, concurrency: int, words: int,
                         rng: random.Random) -> tuple[float, list[float]]:
    """(prompt tokens, wall seconds) of one round, and each request's latency (its TTFT: one token)."""
    async def one() -> tuple[int, float]:
        started = time.perf_counter()
        body = {"model": model, "prompt": _prompt(words, rng), "max_tokens": 1, "temperature": 0}
        response = await http.post(f"{url}/v1/completions", json=body)
        response.raise_for_status()
        return response.json()["usage"]["prompt_tokens"], time.perf_counter() - started

    started = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return sum(tokens for tokens, _ in results) / wall, [latency for _, latency in results]


async def _decode_round(http: httpx.AsyncClient, url: str, model: str, concurrency: int, output_tokens: int,
                        rng: random.Random) -> tuple[float, list[float]]:
    """(generated tokens per wall second, each stream's mean inter-token gap) of one round."""
    async def one() -> tuple[int, float]:
        body = {"model": model, "prompt": _prompt(8, rng), "max_tokens": output_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True}
        stamps: list[float] = []
        async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if chunk.get("choices") and chunk["choices"][0].get("text"):
                        stamps.append(time.perf_counter())
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        return len(stamps), sum(gaps) / len(gaps) if gaps else 0.0

    started = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return sum(n for n, _ in results) / wall, [gap for _, gap in results]


async def sweep(url: str, model: str, prefill_concurrency: list[int], decode_concurrency: list[int],
                prompt_words: int, output_tokens: int, seed: int = 0,
                progress=status) -> tuple[list[PrefillPoint], list[DecodePoint]]:
    rng = random.Random(seed)
    prefill, decode = [], []
    async with httpx.AsyncClient(timeout=300.0) as http:
        for c in prefill_concurrency:
            rates, latencies = [], []
            for _ in range(ROUNDS):
                rate, lat = await _prefill_round(http, url, model, c, prompt_words, rng)
                rates.append(rate)
                latencies += lat
            prefill.append(PrefillPoint(c, sum(rates) / len(rates), p90(latencies)))
            progress(f"prefill x{c}: {prefill[-1].tokens_per_s:.0f} tok/s, TTFT p90 {prefill[-1].ttft_p90_s:.3f} s")
        for c in decode_concurrency:
            rates, gaps = [], []
            for _ in range(ROUNDS):
                rate, g = await _decode_round(http, url, model, c, output_tokens, rng)
                rates.append(rate)
                gaps += g
            decode.append(DecodePoint(c, p90(gaps), sum(rates) / len(rates)))
            progress(f"decode x{c}: ITL p90 {decode[-1].itl_p90_s:.4f} s, {decode[-1].tokens_per_s:.0f} tok/s")
    return prefill, decode


def _counts(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 or v > 256 for v in values):
        raise FleetError(f"{option}: a comma-separated list of concurrencies in 1..256, not {text!r}",
                         code="validation_failed", field=option.lstrip("-"), status=422)
    return values


def pd_profile(
    ctx: typer.Context,
    class_ref: Annotated[str, typer.Argument(metavar="CLASS_REF", help="the class revision NAME@rN", show_default=False)],
    engine: Annotated[str | None, typer.Option("--engine", help="the engine to measure (default: its first ready one)",
                                               show_default=False)] = None,
    ttft_slo_s: Annotated[float, typer.Option("--ttft-slo", min=0.001, help="TTFT p90 seconds a point must keep")] = 2.0,
    itl_slo_s: Annotated[float, typer.Option("--itl-slo", min=0.0001, help="ITL p90 seconds a point must keep")] = 0.1,
    prefill_concurrency: Annotated[str, typer.Option("--prefill-concurrency")] = "1,2,4",
    decode_concurrency: Annotated[str, typer.Option("--decode-concurrency")] = "1,2,4,8",
    prompt_words: Annotated[int, typer.Option("--prompt-words", min=8, max=4000, help="words per prefill prompt")] = 256,
    output_tokens: Annotated[int, typer.Option("--output-tokens", min=4, max=2048, help="tokens per decode stream")] = 32,
    store: Annotated[bool, typer.Option("--store/--no-store", help="store it for the planner")] = True,
    reason: ReasonOption = None,
    output: OutputOption = Format.table,
) -> None:
    """Measure prefill tokens/s and decode slots within the SLOs on one engine of CLASS_REF; store them."""
    prefill_c, decode_c = _counts(prefill_concurrency, "--prefill-concurrency"), _counts(decode_concurrency, "--decode-concurrency")
    api = client(ctx)
    candidates = [e for e in api.list_engines() if e.class_ref == class_ref and e.state == "ready" and e.url
                  and (engine is None or e.name == engine)]
    if not candidates:
        which = f"engine {engine!r} of {class_ref}" if engine else f"a ready engine of {class_ref}"
        raise NotFound(f"class_ref: no {which} to profile", field="class_ref")
    target = sorted(candidates, key=lambda e: e.name)[0]
    status(f"profiling {target.name} ({target.role}) at {target.url}")
    prefill, decode = asyncio.run(sweep(target.url or "", target.model, prefill_c, decode_c, prompt_words, output_tokens))
    fitted = fit(prefill, decode, ttft_slo_s, itl_slo_s)
    for note in fitted.notes:
        status(note)
    detail: dict[str, Any] = {"engine": target.name, "ttft_slo_s": ttft_slo_s, "itl_slo_s": itl_slo_s,
                              "prompt_words": prompt_words, "output_tokens": output_tokens,
                              "prefill": [asdict(p) for p in prefill], "decode": [asdict(d) for d in decode],
                              "notes": list(fitted.notes)}
    if store:
        emit(api.set_pd_profile(class_ref, fitted.prefill_tokens_per_s, fitted.decode_slots, detail, reason,
                                decode_itl_s=fitted.decode_itl_s), output)
    else:
        emit({"class_ref": class_ref, "prefill_tokens_per_s": fitted.prefill_tokens_per_s,
              "decode_slots": fitted.decode_slots, "decode_itl_s": fitted.decode_itl_s, "detail": detail}, output)

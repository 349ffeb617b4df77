"""Probes and recording through the real serving path: a controller (in this process, SQLite), a tiny reference
engine reported by an agent as serving class revision tiny@r1, and a gateway (`fleetctl gateway serve`) on the
controller's routing table, all on loopback.

- send_probe reads what the gateway really returns: token ids (`token_id:<id>`) equal to the engine's own
  greedy answer, the top-k logprobs, usage, and `x-fleet-served-by` split into class and engine; pinned and
  production probes alike, with and without fillers (which the gateway serves alongside the probe).
- record_reference over send_probe: the tiny model's batch-invariant answers give a reference with no noise.
- `fleetctl canary record` end to end: the golden set and the reference are stored; a prompt too long for the
  class's window is refused naming the entry, with nothing stored.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared process helpers

from gateway.procs import Launcher, Proc, wait_until  # noqa: E402

from fleetctl.canary.golden import load_golden, parse_golden, shipped_golden  # noqa: E402
from fleetctl.canary.probe_client import FILLER_PROMPT, ProbeError, filler_body, filler_path, send_probe  # noqa: E402
from fleetctl.canary.record import record_reference  # noqa: E402
from fleetctl.canary.types import GoldenPrompt, ProbeOutput  # noqa: E402
from fleetctl.cli.main import app  # noqa: E402
from fleetctl.client import ControllerClient  # noqa: E402
from fleetctl.controller.server import ServerThread  # noqa: E402
from fleetctl.controller.settings import ControllerSettings  # noqa: E402
from fleetctl.controller.testing import role_tokens  # noqa: E402

pytestmark = pytest.mark.slow
CLASS = {"model": "tiny", "weights": "tiny", "max_model_len": 512}
TINY = load_golden(shipped_golden("tiny"))
CHAT, COMPLETION = TINY.prompts[0], next(p for p in TINY.prompts if p.prompt is not None)


@dataclass
class Fleet:
    server: ServerThread
    tokens: dict[str, str]
    engine: Proc
    gateway: Proc

    def cli(self, *args: str) -> object:
        return CliRunner().invoke(app, ["--controller", self.server.url, "--token", self.tokens["operator"], *args])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    state = tmp_path_factory.mktemp("canary-controller")
    launcher = Launcher(tmp_path_factory.mktemp("canary-procs"))
    settings = ControllerSettings(db_url=f"sqlite:///{state / 'fleet.db'}", state_dir=state, port=0,
                                  down_after_s=3600, reconcile_interval_s=0.5)
    try:
        with ServerThread(settings) as server:
            tokens = role_tokens(server.runtime.store)
            engine = launcher.engine()
            with ControllerClient(server.url, tokens["admin"]) as api:
                api.apply_class("tiny", CLASS)
                api.register_agent({"node": "n1", "url": "http://127.0.0.1:1", "labels": {},
                                    "capacity": {"engines": 1, "kv_mib": 64}, "agent_version": "test"})
                api.heartbeat({"node": "n1", "generation": 0, "cut_off_s": None, "engines": [{
                    "name": "tiny-0", "model": "tiny", "class_ref": "tiny@r1", "role": "mixed", "state": "ready",
                    "pid": engine.pid, "port": engine.port, "url": engine.url, "kv_events_endpoint": None,
                    "restarts": 0, "last_exit": None, "metrics": {}}]})
                api.set_traffic("tiny", {"tiny@r1": 1.0}, reason="canary probe test")
            gateway = launcher.gateway("--controller", server.url, "--token", tokens["admin"], "--table-refresh-s", "0.5",
                                       "--max-retries", "0")
            wait_until(lambda: gateway.post("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1})
                       .status_code == 200, 60, "the gateway to route tiny")
            yield Fleet(server, tokens, engine, gateway)
    finally:
        launcher.stop_all()


def probe(fleet: Fleet, prompt: GoldenPrompt, **kwargs: object) -> ProbeOutput:
    async def go() -> ProbeOutput:
        async with httpx.AsyncClient() as client:
            return await send_probe(client, fleet.gateway.url, "tiny", prompt, **kwargs)  # type: ignore[arg-type]
    return asyncio.run(go())


def engine_answer(fleet: Fleet, prompt: GoldenPrompt) -> list[int]:
    """The engine's own greedy tokens for the prompt, asked directly (no gateway)."""
    body = {"model": "tiny", "temperature": 0, "max_tokens": prompt.sampling.max_tokens, "logprobs": 1,
            "return_tokens_as_token_ids": True}
    if prompt.messages is not None:
        answer = fleet.engine.post("/v1/chat/completions", {**body, "messages": prompt.messages, "logprobs": True}).json()
        return [int(t["token"].split(":")[1]) for t in answer["choices"][0]["logprobs"]["content"]]
    answer = fleet.engine.post("/v1/completions", {**body, "prompt": prompt.prompt}).json()
    return [int(t.split(":")[1]) for t in answer["choices"][0]["logprobs"]["tokens"]]


@pytest.mark.parametrize("prompt", [CHAT, COMPLETION], ids=["chat", "completion"])
def test_a_pinned_probe_reads_tokens_logprobs_usage_and_served_by(fleet: Fleet, prompt: GoldenPrompt) -> None:
    out = probe(fleet, prompt, kind="pinned", pin="tiny@r1")
    assert out.tokens == engine_answer(fleet, prompt) and len(out.tokens) == prompt.sampling.max_tokens
    assert len(out.top_logprobs) == len(out.tokens)
    assert all(len(top) == prompt.sampling.top_logprobs for top in out.top_logprobs)
    assert all(top == sorted(top, key=lambda pair: -pair[1]) and top[0][1] <= 0 for top in out.top_logprobs)
    assert out.tokens[0] == out.top_logprobs[0][0][0]  # greedy: the best token is the one generated
    assert (out.class_ref, out.engine, out.fillers) == ("tiny@r1", "tiny-0", 0)
    assert out.prompt_tokens > 0 and out.completion_tokens == len(out.tokens) and out.text
    assert out.batch_size is None or out.batch_size >= 1  # the engine's report, where it sends one


def test_a_production_probe_with_fillers_gets_the_same_answer(fleet: Fleet) -> None:
    alone = probe(fleet, CHAT, kind="production")
    crowded = probe(fleet, CHAT, kind="pinned", pin="tiny@r1", fillers=3)
    assert alone.class_ref == "tiny@r1" and crowded.fillers == 3
    assert crowded.tokens == alone.tokens  # the tiny model in float32 is batch-invariant
    assert crowded.batch_size is None or crowded.batch_size >= 2


def test_an_engine_pinned_probe_batches_with_short_fillers_on_that_engine(fleet: Fleet) -> None:
    alone = probe(fleet, CHAT, kind="pinned", pin="tiny@r1", engine="tiny-0")
    crowded = probe(fleet, CHAT, kind="pinned", pin="tiny@r1", engine="tiny-0", fillers=3)
    assert (crowded.engine, crowded.fillers) == ("tiny-0", 3) and crowded.tokens == alone.tokens
    assert crowded.batch_size is not None and crowded.batch_size >= 2  # the fillers decoded beside it
    # the short filler is a completion of a few tokens, not the golden prompt again
    body = filler_body("tiny", CHAT, 0, short=True)
    assert body["prompt"] == FILLER_PROMPT and "messages" not in body and filler_path(CHAT, short=True) == "/v1/completions"
    assert filler_body("tiny", CHAT, 0)["messages"] == CHAT.messages


def test_a_probe_pinned_to_a_class_the_model_lacks_is_a_probe_error(fleet: Fleet) -> None:
    with pytest.raises(ProbeError) as caught:
        probe(fleet, CHAT, kind="pinned", pin="other@r1")
    assert caught.value.http_status == 400 and "the gateway answered 400" in str(caught.value)


def test_record_reference_through_the_gateway(fleet: Fleet) -> None:
    golden = parse_golden({**TINY.model_dump(mode="json"), "prompts": [p.model_dump(mode="json") for p in TINY.prompts[:3]]},
                          source="tiny")
    lines: list[str] = []

    async def go() -> object:
        async with httpx.AsyncClient() as client:
            async def send(prompt: GoldenPrompt, fillers: int) -> ProbeOutput:
                return await send_probe(client, fleet.gateway.url, "tiny", prompt, kind="pinned", pin="tiny@r1",
                                        fillers=fillers)
            return await record_reference(send, golden, "tiny@r1", "d" * 64, repetitions=2, conditions=(1, 4),
                                          recorded_by="test", now=datetime.now(timezone.utc), progress=lines.append)

    reference = asyncio.run(go())
    assert list(reference.prompts) == [p.id for p in golden.prompts] and len(lines) == 3
    for prompt in golden.prompts:
        recorded = reference.prompts[prompt.id]
        assert recorded.tokens == engine_answer(fleet, prompt)
        assert {c: (n.runs, n.diverged) for c, n in recorded.noise.items()} == {1: (2, 0), 4: (2, 0)}


def test_canary_record_stores_the_golden_set_and_the_reference(fleet: Fleet, tmp_path: Path) -> None:
    result = fleet.cli("canary", "record", "--class", "tiny@r1", "--golden", "tiny", "--gateway", fleet.gateway.url,
                       "--repetitions", "1", "--conditions", "1,4", "-o", "json")
    assert result.exit_code == 0, result.output
    assert "golden set tiny v1: changed (12 prompts)" in result.stderr
    assert sum(line.startswith(("chat-", "completion-", "seeded-")) for line in result.stderr.splitlines()) == 12
    with ControllerClient(fleet.server.url, fleet.tokens["viewer"]) as api:
        (stored,) = api.list_references(model="tiny")
        assert (stored.class_ref, stored.prompts, stored.noise[4].runs, stored.noise[4].diverged) == ("tiny@r1", 12, 12, 0)
        sets = api.list_golden_sets()

    # a prompt that leaves no room in the 512-token window: refused naming it, nothing more stored
    document = TINY.model_dump(mode="json")
    document.update(name="tiny-long", prompts=[*document["prompts"][:2], {"id": "too-long", "prompt": "word " * 600}])
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(document))
    refused = fleet.cli("canary", "record", "--class", "tiny@r1", "--golden", str(path), "--gateway", fleet.gateway.url)
    assert refused.exit_code == 2, refused.output
    assert refused.stderr.strip().startswith("error: golden set long.yaml: prompts[2] (id 'too-long'): ")
    with ControllerClient(fleet.server.url, fleet.tokens["viewer"]) as api:
        assert api.list_golden_sets() == sets and len(api.list_references()) == 1

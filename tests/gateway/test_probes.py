"""The gateway's active probes against a real loopback HTTP server: /health decides routability, /metrics
feeds the load sample, both on one kept-alive connection, and a silent or refusing engine is marked down."""

from __future__ import annotations

import asyncio

from fleetctl.gateway.engine_state import EngineLive
from fleetctl.gateway.probes import EngineProber
from fleetctl.httpwire import EngineClient

METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{model_name="m"} 3.0\n'
    'vllm:num_requests_waiting{model_name="m"} 2.0\n'
    'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
)


class EngineStub:
    """A loopback HTTP/1.1 server answering GET /health with `health_status` and GET /metrics with METRICS;
    `stall` makes it read requests and never answer."""

    def __init__(self) -> None:
        self.health_status = 200
        self.stall = False
        self.connections = 0
        self.paths: list[str] = []
        self.server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> "EngineStub":
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                self.paths.append(path)
                if self.stall:
                    await asyncio.sleep(3600)
                status, body = (self.health_status, b"{}") if path == "/health" else (200, METRICS.encode())
                writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()


async def test_a_healthy_engine_is_sampled_over_one_kept_alive_connection() -> None:
    async with EngineStub() as stub:
        client = EngineClient()
        prober = EngineProber(client, timeout_s=2.0)
        live = EngineLive("e", stub.url)
        for _ in range(3):
            await prober.probe_once(live)
        await client.aclose()
    assert live.healthy
    assert live.sample is not None
    assert (live.sample.num_running, live.sample.num_waiting, live.sample.kv_cache_usage) == (3, 2, 0.25)
    assert stub.paths == ["/health", "/metrics"] * 3
    assert stub.connections == 1


async def test_health_not_200_takes_the_engine_out_and_200_brings_it_back() -> None:
    async with EngineStub() as stub:
        client = EngineClient()
        prober = EngineProber(client, timeout_s=2.0)
        live = EngineLive("e", stub.url)
        stub.health_status = 503
        await prober.probe_once(live)
        assert not live.healthy and live.down_reason == "/health answered 503"
        assert stub.paths == ["/health"]  # no scrape of an engine that is down
        stub.health_status = 200
        await prober.probe_once(live)
        await client.aclose()
    assert live.healthy and live.down_reason is None


async def test_an_engine_that_does_not_answer_in_time_is_down() -> None:
    async with EngineStub() as stub:
        client = EngineClient()
        prober = EngineProber(client, timeout_s=0.2)
        live = EngineLive("e", stub.url)
        stub.stall = True
        await prober.probe_once(live)
        await client.aclose()
    assert not live.healthy and live.down_reason == "unreachable (TimeoutError)"


async def test_nothing_listening_is_down() -> None:
    async with EngineStub() as stub:
        url = stub.url
    client = EngineClient()
    live = EngineLive("e", url)
    await EngineProber(client, timeout_s=1.0).probe_once(live)
    await client.aclose()
    assert not live.healthy and live.down_reason == "unreachable (EngineConnectError)"

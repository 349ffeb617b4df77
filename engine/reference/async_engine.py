"""Runs the engine core on its own thread and gives each request an asyncio stream of outputs.

The engine thread owns `LLMEngine` entirely: requests, aborts and K/V exports reach it as commands on a
queue, and its outputs go back to each request's asyncio.Queue through `loop.call_soon_threadsafe`.
Between steps the thread drains commands; with no work it blocks on the queue, so an idle engine costs
nothing. Step listeners (metrics, KV-event publisher) run on the engine thread after every step.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.contract.faults import Fault
from engine.reference.config import EngineConfig
from engine.reference.kv_sinks import KVPushSink
from engine.reference.llm_engine import LLMEngine
from engine.contract.outputs import IterationStats, RequestOutput, SchedulerStats, StepResult
from engine.contract.sampling_params import SamplingParams

log = logging.getLogger(__name__)

_IDLE_POLL_S = 0.5  # with no work, wake up this often to release expired held blocks


@dataclass
class _Call:
    """Run fn(engine) on the engine thread and resolve the future with its result."""

    fn: Callable[[LLMEngine], Any]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue


class AsyncEngine:
    def __init__(self, config: EngineConfig, fault: Fault | None = None):
        """`fault`: a planted fault the engine computes with (engine.reference.planted_fault); `config` is
        still what it reports."""
        self.config = config
        self.fault = fault
        self.engine: LLMEngine | None = None
        self._commands: queue.Queue[_Call | None] = queue.Queue()
        self._streams: dict[str, _Stream] = {}
        self._listeners: list[Callable[[StepResult], None]] = []
        self._thread: threading.Thread | None = None
        self._stats = SchedulerStats()
        self._stopping = False

    # --- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Load the model (seconds) and start the engine thread."""
        self.engine = LLMEngine(self.config, fault=self.fault)
        self._stats = self.engine.scheduler_stats()
        self._thread = threading.Thread(target=self._run, name="engine-step", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stopping = True
        self._commands.put(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def ready(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def add_step_listener(self, fn: Callable[[StepResult], None]) -> None:
        self._listeners.append(fn)

    # --- what the server reads ----------------------------------------------------------------------

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def eos_token_id(self) -> int:
        return self.engine.eos_token_id

    @property
    def num_blocks(self) -> int:
        return self.engine.runner.num_blocks

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def bytes_per_block(self) -> int:
        return self.engine.runner.bytes_per_block

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.engine.runner.kv_dtype

    @property
    def kv_block_shape(self) -> tuple:
        return tuple(self.engine.runner.kv_block_shape())

    def cached_prefix_blocks(self, hashes: list) -> int:
        """A hint from any thread: the leading blocks of `hashes` the prefix cache holds now."""
        return self.engine.block_manager.cached_prefix_blocks(hashes)

    @property
    def num_unfinished(self) -> int:
        return len(self._streams)

    def stats(self) -> SchedulerStats:
        return self._stats

    # --- requests -----------------------------------------------------------------------------------

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        external_kv: torch.Tensor | None = None,
        external_kv_tokens: int = 0,
        external_kv_first_block: int = 0,
        hold_blocks: bool = False,
        kv_push: KVPushSink | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs. Invalid requests raise engine.errors.* before the first yield;
        leaving the iteration early (client gone, task cancelled) aborts the request and frees its blocks."""
        self.engine.validate(prompt_token_ids, params)
        if request_id in self._streams:
            from engine.errors import InvalidRequest

            raise InvalidRequest(f"request id {request_id!r} is already running", param="request_id")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue())
        self._streams[request_id] = stream
        add = lambda engine: engine.add_request(  # noqa: E731
            request_id, prompt_token_ids, params, external_kv=external_kv, external_kv_tokens=external_kv_tokens,
            external_kv_first_block=external_kv_first_block, hold_blocks=hold_blocks, kv_push=kv_push,
        )
        finished = False
        try:
            await self._call(add)
            while True:
                output: RequestOutput | BaseException = await stream.queue.get()
                if isinstance(output, BaseException):
                    raise output
                finished = output.finished
                yield output
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._commands.put(_Call(lambda engine: engine.abort(request_id)))

    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise engine.errors.* naming the field if the request can never run (cheap; any thread)."""
        self.engine.validate(prompt_token_ids, params)

    async def pull_held(self, request_id: str, block_ids: list[int], out: torch.Tensor | None = None,
                        release: bool = True) -> torch.Tensor:
        return await self._call(lambda engine: engine.pull_held(request_id, block_ids, out, release))

    def submit(self, fn: Callable[[LLMEngine], Any]) -> concurrent.futures.Future:
        """Run fn(engine) on the engine thread, from any thread (the K/V side channel's): straight to the
        engine thread, without two hops through the event loop."""
        call = _Call(fn)
        self._commands.put(call)
        return call.future

    async def abort(self, request_id: str) -> None:
        await self._call(lambda engine: engine.abort(request_id))

    async def export_kv(self, block_ids: list[int]) -> torch.Tensor:
        return await self._call(lambda engine: engine.export_kv(block_ids))

    async def release_held(self, request_id: str) -> bool:
        return await self._call(lambda engine: engine.release_held(request_id))

    async def reset_prefix_cache(self) -> bool:
        return await self._call(lambda engine: engine.reset_prefix_cache())

    async def _call(self, fn: Callable[[LLMEngine], Any]) -> Any:
        call = _Call(fn)
        self._commands.put(call)
        return await asyncio.wrap_future(call.future)

    # --- the engine thread --------------------------------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        while not self._stopping:
            if not self._drain_commands(block=not engine.has_work()):
                break
            if engine.has_work():
                self._step(engine)

    def _drain_commands(self, block: bool) -> bool:
        """Run queued commands; block for the first one when idle. False when asked to stop."""
        try:
            call = self._commands.get(timeout=_IDLE_POLL_S) if block else self._commands.get_nowait()
        except queue.Empty:
            if block and self.engine.release_expired():
                self._notify_state_change()
            return True
        while call is not None:
            self._run_call(call)
            try:
                call = self._commands.get_nowait()
            except queue.Empty:
                return True
        return False

    def _run_call(self, call: _Call) -> None:
        try:
            result = call.fn(self.engine)
        except BaseException as exc:  # handed to the awaiting coroutine, which re-raises it
            call.future.set_exception(exc)
            return
        call.future.set_result(result)
        if isinstance(result, RequestOutput):  # an abort: tell the stream, if it is still listening
            self._deliver(result)
        self._notify_state_change()

    def _notify_state_change(self) -> None:
        """Tell listeners what a command or an expiry changed between steps: gauges, KV events, aborts."""
        engine = self.engine
        self._stats = engine.scheduler_stats()
        iteration = IterationStats(finished=engine.take_pending_finished())
        self._notify(StepResult(iteration=iteration, scheduler=self._stats,
                                kv_events=engine.block_manager.take_events(), is_step=False))

    def _step(self, engine: LLMEngine) -> None:
        try:
            result = engine.step()
        except Exception as exc:  # a bug or OOM in the step must not hang every client
            log.exception("engine step failed; failing the running requests")
            self._fail_all(exc)
            return
        self._stats = result.scheduler
        for output in result.outputs:
            self._deliver(output)
        self._notify(result)

    def _notify(self, result: StepResult) -> None:
        for listener in self._listeners:
            try:
                listener(result)
            except Exception:
                log.exception("step listener failed")

    def _deliver(self, output: RequestOutput) -> None:
        stream = self._streams.get(output.request_id)
        if stream is not None:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, output)

    def _fail_all(self, exc: Exception) -> None:
        for request_id, stream in list(self._streams.items()):
            self.engine.abort(request_id)
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)

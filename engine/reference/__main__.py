"""`python -m engine.reference --model tiny --port 8100 ...`: load the model, then serve the HTTP API.

The model loads before the port is bound, so /health answers only once the engine is ready. The first
SIGTERM (or SIGINT) drains: /health and new /v1 requests get 503 with Retry-After, in-flight requests get
--drain-grace-s to finish, then the process exits 0. A second signal exits at once. A flag value the
settings refuse (e.g. `--port 70000`) exits 2 with one line naming the field, before anything loads; so does
an unknown planted fault in FLEET_ENGINE_PLANTED_FAULT (engine.reference.planted_fault). An active planted fault
is logged as one WARNING line at start-up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

import uvicorn

from engine.process_settings import SettingsError
from engine.reference.cli_args import build_parser, config_from_args

log = logging.getLogger("engine.reference")

_FORCED_SHUTDOWN_S = 5  # after the drain (or a second signal): how long uvicorn waits for open connections


class DrainingServer(uvicorn.Server):
    """uvicorn whose first exit signal starts our drain instead of closing the listening socket at once
    (so new requests get a clean 503, not a refused connection)."""

    def __init__(self, config: uvicorn.Config, begin_drain: Callable[[], None]):
        super().__init__(config)
        self._begin_drain = begin_drain
        self._drain_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_requested or self._loop is None:
            super().handle_exit(sig, frame)  # a second signal, or one before startup: exit now
            return
        self._drain_requested = True
        log.info("received %s: draining", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(self._begin_drain)

    def request_exit(self) -> None:
        self.should_exit = True


USAGE_ERROR = 2  # as argparse exits on a bad flag


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except SettingsError as exc:  # a value argparse's types let through but the settings refuse: one line
        print(f"{parser.prog}: error: {exc.message}", file=sys.stderr)
        return USAGE_ERROR

    from engine.reference import planted_fault  # torch: imported only when serving
    from engine.reference.async_engine import AsyncEngine
    from engine.reference.server import build_app

    try:
        fault = planted_fault.fault_from_env(os.environ)
    except planted_fault.UnknownFault as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    if fault is not None:
        log.warning("%s", planted_fault.describe(fault))
    engine = AsyncEngine(config, fault=fault)
    log.info("loading model %s", config.model)
    engine.start()
    holder: dict[str, DrainingServer] = {}
    app = build_app(engine, config, on_exit=lambda: holder["server"].request_exit())
    uv_config = uvicorn.Config(
        app, host=config.host, port=config.port, log_level=args.log_level, access_log=False,
        timeout_graceful_shutdown=_FORCED_SHUTDOWN_S, timeout_keep_alive=5,
    )
    server = holder["server"] = DrainingServer(uv_config, begin_drain=app.state.serving.begin_drain)
    try:
        server.run()
    finally:
        engine.shutdown()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())

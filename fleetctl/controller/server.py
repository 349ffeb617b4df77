"""Running the controller: `serve` (uvicorn, foreground), `migrate` (schema only), and `ServerThread`
(a real controller on loopback inside a test or an embedding process).

A test that wants a controller in a separate process runs:
    FLEET_STATE_DIR=<tmp> FLEET_BOOTSTRAP_TOKEN=<16+ chars> python -m fleetctl.cli.main controller serve --port <p>
(add FLEET_DB_URL=postgresql+psycopg://... for PostgreSQL) and polls GET /healthz.
"""

from __future__ import annotations

import gc
import logging
import socket
import sys
import threading
import time

import uvicorn

from fleetctl.controller.api.app import create_app
from fleetctl.controller.db import Store, current_revision, migrate
from fleetctl.controller.runtime import ControllerRuntime
from fleetctl.controller.settings import ControllerSettings

log = logging.getLogger(__name__)
STARTUP_FAILURE = 3  # uvicorn's exit status when the server could not start
GIL_SWITCH_INTERVAL_S = 0.0005
GC_YOUNG_THRESHOLD = 20_000  # allocations between young collections (CPython's default: 700)


def serve(settings: ControllerSettings, log_level: str = "info", access_log: bool = False) -> None:
    """Run the controller in the foreground until interrupted."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))  # not a line per canary probe
    where = "PostgreSQL" if not settings.is_sqlite else f"SQLite in {settings.state_dir}"
    log.info("controller on http://%s:%d, state in %s", settings.host, settings.port, where)
    # The event loop answers heartbeats while the flush and reconcile threads run batches of Python: with the
    # default 5 ms GIL switch interval every request waiting behind a batch waited 5 ms per hand-over.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    app = create_app(settings)
    quiet_garbage_collector()
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level, access_log=access_log)
    server = ControllerServer(config, app.state.runtime)
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn raises the signal it shut down on again: Ctrl-C is a clean exit (as uvicorn.run)
        pass
    if not server.started:
        sys.exit(STARTUP_FAILURE)


class ControllerServer(uvicorn.Server):
    """uvicorn's server, ending the change stream's connections first when it shuts down: uvicorn waits for
    open responses to finish before it stops, and a watch stream would never finish by itself."""

    def __init__(self, config: uvicorn.Config, runtime: ControllerRuntime):
        super().__init__(config)
        self.runtime = runtime

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.runtime.watch.close()
        await super().shutdown(sockets)


def quiet_garbage_collector() -> None:
    """Keep full garbage collections short and rare. Measured at 1,000 heartbeats a second: a full collection
    every ~2 s paused the process 80-100 ms (the p99 heartbeat latency) while collecting almost nothing, most
    of it scanning the objects of the imported modules (SQLAlchemy, pydantic, FastAPI). Those live as long as
    the process: `gc.freeze` moves them out of the collector's sight. A larger young generation lets the
    short-lived objects of each request die before they are promoted."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)


def migrate_only(settings: ControllerSettings) -> str | None:
    """Apply migrations; return the schema revision now in place."""
    store = Store.from_url(settings.database_url)
    try:
        migrate(store.engine)
        return current_revision(store.engine)
    finally:
        store.close()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerThread:
    """A real controller (uvicorn on loopback) in a background thread.

        with ServerThread(settings) as server:
            client = ControllerClient(server.url, token)
    """

    def __init__(self, settings: ControllerSettings, runtime: ControllerRuntime | None = None):
        """`runtime`: one built by the caller over these settings (e.g. with a test clock); default a new one."""
        if settings.port == 0:
            settings = settings.model_copy(update={"port": free_port(settings.host)})
        self.settings = settings
        self.runtime = runtime if runtime is not None else ControllerRuntime(settings)
        config = uvicorn.Config(create_app(runtime=self.runtime), host=settings.host, port=settings.port,
                                log_level="warning", access_log=False, lifespan="on")
        self._server = ControllerServer(config, self.runtime)
        self._thread = threading.Thread(target=self._server.run, name="fleetctl-controller", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    def start(self, timeout_s: float = 30.0) -> "ServerThread":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the controller did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

"""Run the gateway: `serve(settings)` builds the app and runs uvicorn until SIGTERM/SIGINT.

Stateless: nothing is written anywhere, so several gateways can run side by side behind a load balancer;
each keeps its own routing-table cache, probes, prefix index and shares.
"""

from __future__ import annotations

import logging

import uvicorn

from fleetctl.gateway.app import build_app
from fleetctl.gateway.settings import GatewaySettings

SHUTDOWN_GRACE_S = 5  # how long open streams get to finish on SIGTERM


def serve(settings: GatewaySettings, log_level: str = "info") -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))  # not a line per probe
    app = build_app(settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=SHUTDOWN_GRACE_S, timeout_keep_alive=30,
                            proxy_headers=False)  # client addresses are never used: skip X-Forwarded-* parsing per request
    uvicorn.Server(config).run()

"""Canary alerts to a webhook (settings.canary_webhook_url): each alert and recovery POSTed as JSON from a
background thread, with a short timeout. Delivery is best effort: it never blocks or fails the verdict
reconciler's run, and a failure is logged without the URL's query string (which may carry a token)."""

from __future__ import annotations

import logging
import threading
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

log = logging.getLogger(__name__)

TIMEOUT_S = 2.0


def redacted(url: str) -> str:
    """The URL without its query, fragment or credentials: what a log line may show."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def post(url: str, payload: dict[str, Any], timeout_s: float = TIMEOUT_S) -> bool:
    """POST one event; True when the receiver answered 2xx. Never raises."""
    try:
        response = httpx.post(url, json=payload, timeout=timeout_s)
    except Exception as exc:  # any failure of a best-effort delivery is only logged
        log.warning("canary webhook %s: %s", redacted(url), type(exc).__name__)
        return False
    if not response.is_success:
        log.warning("canary webhook %s answered %d", redacted(url), response.status_code)
        return False
    return True


def post_in_background(url: str, payloads: list[dict[str, Any]]) -> threading.Thread:
    """Deliver `payloads` in order from a daemon thread (returned, so tests can join it)."""
    def deliver() -> None:
        for payload in payloads:
            post(url, payload)

    thread = threading.Thread(target=deliver, name="fleetctl-canary-webhook", daemon=True)
    thread.start()
    return thread

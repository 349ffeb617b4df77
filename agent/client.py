"""A client of the agent's local API (agent/api.py), for the break-glass CLI and the local fleet.

Errors raise `AgentApiError` with the HTTP status (0: unreachable) and the error body, which has the
controller's shape, so callers map it to their own error family.
"""

from __future__ import annotations

from typing import Any

import httpx


class AgentApiError(Exception):
    def __init__(self, status: int, body: Any, message: str):
        super().__init__(message)
        self.status, self.body, self.message = status, body, message


class AgentClient:
    def __init__(self, url: str, *, admin_token: str | None = None, timeout_s: float = 10.0):
        self.url = url.rstrip("/")
        self.admin_token = admin_token
        self.timeout_s = timeout_s

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def engines(self) -> list[dict[str, Any]]:
        return self._call("GET", "/engines")["engines"]

    def act(self, engine: str, action: str) -> dict[str, Any]:
        """Break-glass: action is drain, restart or stop."""
        return self._call("POST", f"/engines/{engine}/{action}")

    def _call(self, method: str, path: str) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        try:
            response = httpx.request(method, self.url + path, headers=headers, timeout=self.timeout_s)
        except httpx.HTTPError as exc:
            raise AgentApiError(0, None, f"agent {self.url} unreachable: {exc}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_error:
            detail = body.get("error", {}) if isinstance(body, dict) else {}
            raise AgentApiError(response.status_code, body, detail.get("message") or f"HTTP {response.status_code}")
        return body

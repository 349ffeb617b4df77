"""The typed client against a real controller on loopback: errors become the fleetctl.errors family,
and the async client speaks the agent and gateway calls."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from ctl_helpers import SPEC

from fleetctl.client import AsyncControllerClient, ControllerClient
from fleetctl.controller.server import ServerThread, free_port
from fleetctl.controller.settings import ControllerSettings
from fleetctl.controller.testing import role_tokens
from fleetctl.errors import AuthError, Conflict, NotFound, Unavailable, ValidationFailed


@pytest.fixture
def server(db_url: str, tmp_path: Path) -> Iterator[ServerThread]:
    settings = ControllerSettings(db_url=db_url, state_dir=tmp_path, port=0, reconcile_interval_s=0.1)
    with ServerThread(settings) as running:
        yield running


def test_client_errors_are_typed(server: ServerThread) -> None:
    tokens = role_tokens(server.runtime.store)
    with ControllerClient(server.url, tokens["operator"]) as client:
        assert client.apply_class("chat", SPEC, reason="test").ref == "chat@r1"
        with pytest.raises(ValidationFailed) as invalid:
            client.set_deployment("chat", "chat@r1", -1)
        assert (invalid.value.field, invalid.value.status) == ("replicas", 422)
        with pytest.raises(NotFound):
            client.get_class("nope")
        with pytest.raises(AuthError) as forbidden:
            client.list_tokens()
        assert forbidden.value.status == 403 and "admin" in forbidden.value.message
    with ControllerClient(server.url, tokens["admin"]) as admin:
        admin.create_token("dup", "viewer")
        with pytest.raises(Conflict):
            admin.create_token("dup", "viewer")
    with ControllerClient(server.url, "fleet_wrong") as stranger, pytest.raises(AuthError) as unknown:
        stranger.status()
    assert unknown.value.status == 401
    assert "fleet_wrong" not in repr(stranger) and "fleet_wrong" not in str(unknown.value)


def test_unreachable_controller_is_unavailable() -> None:
    with ControllerClient(f"http://127.0.0.1:{free_port()}", "t", timeout=2) as client, pytest.raises(Unavailable):
        client.status()


async def test_async_client_agent_and_gateway_calls(server: ServerThread) -> None:
    tokens = role_tokens(server.runtime.store)
    with ControllerClient(server.url, tokens["operator"]) as operator:
        operator.apply_class("chat", SPEC)
        operator.set_deployment("chat", "chat", 1)
    async with AsyncControllerClient(server.url, tokens["agent"]) as agent:
        registered = await agent.register_agent(
            {"node": "n1", "url": "http://n1", "labels": {}, "capacity": {"engines": 2, "kv_mib": 1}, "agent_version": "t"})
        assert registered.node == "n1"
        reply = await agent.heartbeat({"node": "n1", "generation": 0, "engines": [], "cut_off_s": None})
        for _ in range(200):  # the background reconciler places the engine within a few passes
            if reply.assignment:
                break
            await asyncio.sleep(0.05)
            reply = await agent.heartbeat({"node": "n1", "generation": 0, "engines": [], "cut_off_s": None})
        assert [a.name for a in reply.assignment] == ["chat-0"]
        with pytest.raises(AuthError):
            await agent.routing()  # agent tokens only reach /api/v1/agents/*
    async with AsyncControllerClient(server.url, tokens["viewer"]) as gateway:
        table = await gateway.routing()
        assert "smollm2-135m" in table.models

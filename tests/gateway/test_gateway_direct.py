"""Direct mode on a real gateway process (static engines, no controller at all): local flag overrides on the
gateway's own break-glass credential change serving at once (a shed answers 429 with Retry-After), survive a
restart of the gateway, are journalled; bad keys and values are 400s naming the field; a wrong or rotated
credential is a 401; without a state directory direct mode is off (404)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from gateway.procs import Launcher

BODY = {"model": "tiny", "prompt": "hello", "max_tokens": 2}


def auth(state: Path) -> dict[str, str]:
    return {"Authorization": f"Bearer {(state / 'breakglass_token').read_text().strip()}"}


def put(url: str, key: str, body: dict, headers: dict[str, str]) -> httpx.Response:
    return httpx.put(f"{url}/fleet/direct/flags/{key}", json=body, headers=headers, timeout=10)


def test_a_direct_shed_applies_at_once_survives_a_restart_and_is_journalled(launcher: Launcher, tmp_path: Path) -> None:
    engine = launcher.engine()
    state = tmp_path / "gw"
    gateway = launcher.gateway("--engines", engine.url, "--state-dir", str(state))
    assert gateway.post("/v1/completions", BODY).status_code == 200
    shed = put(gateway.url, "shed_fraction:tiny", {"value": 1.0, "reason": "overload"}, auth(state))
    assert shed.status_code == 200 and shed.json()["seq"] == 1, shed.text
    refused = gateway.post("/v1/completions", BODY)
    assert refused.status_code == 429 and "retry-after" in refused.headers

    gateway.kill()
    again = launcher.gateway("--engines", engine.url, "--state-dir", str(state))
    assert again.post("/v1/completions", BODY).status_code == 429  # the override outlived the process
    dropped = httpx.request("DELETE", f"{again.url}/fleet/direct/flags/shed_fraction:tiny",
                            json={"reason": "over"}, headers=auth(state), timeout=10)
    assert dropped.status_code == 200 and dropped.json()["seq"] == 2
    assert again.post("/v1/completions", BODY).status_code == 200
    journal = [json.loads(line) for line in (state / "direct-actions.jsonl").read_text().splitlines()]
    assert [(e["seq"], e["action"], e["target"], e["value"], e["reason"]) for e in journal] == [
        (1, "flag.set", "shed_fraction:tiny", 1.0, "overload"), (2, "flag.unset", "shed_fraction:tiny", None, "over")]


def test_bad_direct_calls_are_refused_naming_the_field_and_change_nothing(launcher: Launcher, tmp_path: Path) -> None:
    engine = launcher.engine()
    state = tmp_path / "gw"
    gateway = launcher.gateway("--engines", engine.url, "--state-dir", str(state))
    headers = auth(state)
    for key, body, param in [("no_such_flag", {"value": True}, "key"), ("shed_fraction:tiny", {"value": 2}, "value"),
                             ("pin:tiny", {"value": "nope@r9"}, "value"), ("prefix_routing", {}, "value")]:
        response = put(gateway.url, key, body, headers)
        assert response.status_code == 400 and response.json()["error"]["param"] in (param, "name"), (key, response.text)
    assert put(gateway.url, "prefix_routing", {"value": False}, {"Authorization": "Bearer bg_wrong"}).status_code == 401
    assert put(gateway.url, "prefix_routing", {"value": False}, {}).status_code == 401
    state_now = httpx.get(f"{gateway.url}/fleet/direct", headers=headers, timeout=10).json()
    assert state_now["local"] == {} and state_now["actions"] == []

    rotated = httpx.post(f"{gateway.url}/fleet/direct/rotate", headers=headers, timeout=10)
    assert rotated.status_code == 200
    assert httpx.get(f"{gateway.url}/fleet/direct", headers=headers, timeout=10).status_code == 401
    assert httpx.get(f"{gateway.url}/fleet/direct", headers=auth(state), timeout=10).status_code == 200  # the new file


def test_without_a_state_directory_direct_mode_is_off(launcher: Launcher) -> None:
    engine = launcher.engine()
    gateway = launcher.gateway("--engines", engine.url)
    response = httpx.get(f"{gateway.url}/fleet/direct", headers={"Authorization": "Bearer x"}, timeout=10)
    assert response.status_code == 404 and "direct mode is off" in response.json()["error"]["message"]

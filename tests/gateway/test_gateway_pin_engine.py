"""x-fleet-pin-engine through a real gateway in front of two real tiny engines: a canary probe that names an
engine of the chosen class is served by it (whatever prefix locality would choose), an engine the class does
not have is a 400 naming the header, and on a request that is not a probe the header is ignored."""

from __future__ import annotations

import pytest
from gateway.procs import Launcher, Proc, served_by, static_entry

from engine.contract.faults import PIN_ENGINE_HEADER, PROBE_HEADER

BODY = {"model": "tiny", "prompt": "The river runs past the stone", "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def gateway(launcher: Launcher) -> Proc:
    first, second = launcher.engine(), launcher.engine()
    return launcher.gateway("--engines", f"{static_entry(first)},{static_entry(second)}")


def engine_names(gateway: Proc) -> list[str]:
    return sorted(gateway.get("/health").json()["engines"])


def test_a_probe_is_served_by_the_engine_it_names(gateway: Proc) -> None:
    names = engine_names(gateway)
    assert len(names) == 2
    for name in names + names:  # the same prompt each time: locality alone would keep it on one engine
        response = gateway.post("/v1/completions", BODY, headers={PROBE_HEADER: "pinned", PIN_ENGINE_HEADER: name})
        assert response.status_code == 200, response.text
        assert served_by(response) == name


def test_an_engine_the_class_does_not_have_is_refused_naming_the_header(gateway: Proc) -> None:
    response = gateway.post("/v1/completions", BODY, headers={PROBE_HEADER: "pinned", PIN_ENGINE_HEADER: "nope"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == PIN_ENGINE_HEADER


def test_user_traffic_cannot_pin_an_engine(gateway: Proc) -> None:
    response = gateway.post("/v1/completions", BODY, headers={PIN_ENGINE_HEADER: "nope"})
    assert response.status_code == 200, response.text

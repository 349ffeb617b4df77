"""The canary's controller settings: batch conditions parse from one comma-separated value (flag or
environment), sorted and without repeats; a malformed one is refused naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fleetctl.controller.settings import ControllerSettings


def test_batch_conditions_parse_sorted_and_unique(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ControllerSettings().batch_conditions == (1, 4, 8, 16)
    monkeypatch.setenv("FLEET_CANARY_BATCH_CONDITIONS", "4,1,4")
    assert ControllerSettings.from_env().batch_conditions == (1, 4)


@pytest.mark.parametrize("bad", ["", "0,4", "1,,4", "a", "1;4"])
def test_a_malformed_batch_condition_list_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(ValidationError) as refused:
        ControllerSettings(canary_batch_conditions=bad)
    assert refused.value.errors()[0]["loc"] == ("canary_batch_conditions",)


def test_every_canary_setting_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_CANARY_PRODUCTION_INTERVAL_S", "0.25")
    monkeypatch.setenv("FLEET_CANARY_MIN_PROBES", "3")
    settings = ControllerSettings.from_env()
    assert (settings.canary_production_interval_s, settings.canary_min_probes) == (0.25, 3)

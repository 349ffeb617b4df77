"""The state dir's prefix-hash seed: a new fleet takes vLLM's default, one an older fleetctl started keeps the
old default, the recorded seed never changes, and a FLEET_HASH_SEED that contradicts it is refused."""

from __future__ import annotations

import json

import pytest

from engine.hashing import HASH_SEED_ENV, LEGACY_HASH_SEED, VLLM_DEFAULT_HASH_SEED
from fleetctl.localfleet.fleet import FLEET_FILE, HASH_SEED_FILE, LocalFleetError, fleet_hash_seed


@pytest.fixture(autouse=True)
def no_seed_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HASH_SEED_ENV, raising=False)


def test_a_new_fleet_takes_vllms_default_and_records_it(tmp_path):
    assert fleet_hash_seed(tmp_path) == VLLM_DEFAULT_HASH_SEED
    assert (tmp_path / HASH_SEED_FILE).read_text().strip() == VLLM_DEFAULT_HASH_SEED


def test_a_fleet_an_older_fleetctl_started_keeps_the_old_default(tmp_path):
    (tmp_path / FLEET_FILE).write_text(json.dumps({"state_dir": str(tmp_path), "processes": []}))
    assert fleet_hash_seed(tmp_path) == LEGACY_HASH_SEED
    assert fleet_hash_seed(tmp_path) == LEGACY_HASH_SEED  # and from then on, from the record


def test_the_recorded_seed_is_kept_whatever_the_default(tmp_path, monkeypatch):
    (tmp_path / HASH_SEED_FILE).write_text("1234\n")
    assert fleet_hash_seed(tmp_path) == "1234"
    monkeypatch.setenv(HASH_SEED_ENV, "1234")  # saying the same is fine
    assert fleet_hash_seed(tmp_path) == "1234"


def test_a_seed_from_the_environment_is_recorded_for_a_new_fleet(tmp_path, monkeypatch):
    monkeypatch.setenv(HASH_SEED_ENV, "42")
    assert fleet_hash_seed(tmp_path) == "42" and (tmp_path / HASH_SEED_FILE).read_text().strip() == "42"


def test_an_environment_seed_that_contradicts_the_record_is_refused(tmp_path, monkeypatch):
    (tmp_path / HASH_SEED_FILE).write_text("0\n")
    monkeypatch.setenv(HASH_SEED_ENV, VLLM_DEFAULT_HASH_SEED)
    with pytest.raises(LocalFleetError) as refused:
        fleet_hash_seed(tmp_path)
    assert refused.value.field == "hash_seed" and "'0'" in str(refused.value)
    assert (tmp_path / HASH_SEED_FILE).read_text().strip() == "0"  # unchanged

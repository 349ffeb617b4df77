"""The change stream's diff (watch_diff.py), pure: put, patch with only the changed fields, delete; and
values that only moved with the clock are not changes (the published value stays the old one)."""

from __future__ import annotations

from fleetctl.controller.watch_contract import WatchDelta, WatchSnapshot
from fleetctl.controller.watch_diff import diff
from fleetctl.watch_state import FleetState

NODE = {"name": "n1", "state": "up", "cordoned": False, "heartbeat_age_s": 0.1, "last_heartbeat_at": "t1"}


def test_new_changed_and_gone_keys_are_put_patch_and_delete() -> None:
    old = {"node": {"n1": NODE, "n2": {**NODE, "name": "n2"}}, "flag": {}}
    new = {"node": {"n1": {**NODE, "cordoned": True}, "n3": {**NODE, "name": "n3"}}, "flag": {"f": {"value": 1}}}
    published, changes = diff(old, new)
    assert changes == [
        {"kind": "node", "key": "n1", "op": "patch", "value": {"cordoned": True}},
        {"kind": "node", "key": "n3", "op": "put", "value": {**NODE, "name": "n3"}},
        {"kind": "node", "key": "n2", "op": "delete", "value": None},
        {"kind": "flag", "key": "f", "op": "put", "value": {"value": 1}},
    ]
    assert published == new


def test_a_value_that_only_moved_with_the_clock_is_no_change_and_stays_as_published() -> None:
    old = {"node": {"n1": NODE}, "rollout": {"1": {"id": 1, "pause_left_s": 30.0, "gates": [{"metric": "m", "next_in_s": 4.0}]}}}
    aged = {"node": {"n1": {**NODE, "heartbeat_age_s": 3.4}},
            "rollout": {"1": {"id": 1, "pause_left_s": 27.0, "gates": [{"metric": "m", "next_in_s": 1.0}]}}}
    published, changes = diff(old, aged)
    assert changes == [] and published == old
    beat = {**aged, "node": {"n1": {**NODE, "heartbeat_age_s": 0.2, "last_heartbeat_at": "t2"}}}
    published, changes = diff(published, beat)
    assert changes == [{"kind": "node", "key": "n1", "op": "patch",
                        "value": {"heartbeat_age_s": 0.2, "last_heartbeat_at": "t2"}}]  # refreshed with the change
    assert published["rollout"] == old["rollout"]


def test_a_gone_kind_deletes_its_keys() -> None:
    _published, changes = diff({"drill": {"3": {"id": 3}}}, {})
    assert changes == [{"kind": "drill", "key": "3", "op": "delete", "value": None}]


def test_applying_the_changes_gives_the_published_state() -> None:
    old = {"node": {"n1": NODE, "n2": {**NODE, "name": "n2"}}}
    new = {"node": {"n1": {**NODE, "state": "down", "heartbeat_age_s": 20.0}, "n3": {**NODE, "name": "n3"}}}
    published, changes = diff(old, new)
    state = FleetState()
    state.apply(WatchSnapshot(token="e-0", at="t", ping_s=2.0, resources=old))  # type: ignore[arg-type]
    state.apply(WatchDelta.model_validate({"token": "e-1", "at": "t", "changes": changes}))
    assert state.resources["node"] == published["node"]


def test_a_patch_updates_the_state_but_not_the_messages_it_came_from() -> None:
    snapshot = WatchSnapshot(token="e-0", at="t", ping_s=2.0, resources={"node": {"n1": dict(NODE)}})
    put = WatchDelta.model_validate({"token": "e-1", "at": "t", "changes": [
        {"kind": "node", "key": "n2", "op": "put", "value": {**NODE, "name": "n2"}}]})
    state = FleetState()
    state.apply(snapshot)
    state.apply(put)
    applied = state.apply(WatchDelta.model_validate({"token": "e-2", "at": "t", "changes": [
        {"kind": "node", "key": "n1", "op": "patch", "value": {"state": "down"}},
        {"kind": "node", "key": "n2", "op": "patch", "value": {"cordoned": True}}]}))
    assert state.resources["node"]["n1"]["state"] == "down" and state.resources["node"]["n2"]["cordoned"] is True
    assert snapshot.resources["node"]["n1"]["state"] == "up"  # the snapshot's own value is left as it came
    assert put.changes[0].value is not None and put.changes[0].value["cordoned"] is False
    assert applied.patched == {("node", "n1"): {"state"}, ("node", "n2"): {"cordoned"}}

"""Leader election: two controller instances on one PostgreSQL database; only the leader reconciles,
and the other takes over when the leader goes away. SQLite is always its own leader."""

from __future__ import annotations

from pathlib import Path

from ctl_helpers import SPEC
from sqlalchemy import create_engine

from fleetctl.controller.auth import ADMIN
from fleetctl.controller.classes import apply_class
from fleetctl.controller.contract import RegisterRequest
from fleetctl.controller.deployments import set_deployment
from fleetctl.controller.leader import AdvisoryLockLeader
from fleetctl.controller.nodes import register
from fleetctl.controller.reconciler import current_plan
from fleetctl.controller.runtime import ControllerRuntime, utc_now
from fleetctl.controller.schemas import DeploymentSet
from fleetctl.controller.settings import ControllerSettings
from fleetctl.replica_class import ReplicaClassSpec


def runtime(url: str, state_dir: Path) -> ControllerRuntime:
    instance = ControllerRuntime(ControllerSettings(db_url=url, state_dir=state_dir, background=False))
    instance.start()
    return instance


def seed(instance: ControllerRuntime) -> None:
    now = utc_now()
    with instance.store.session() as session:
        apply_class(session, "chat", ReplicaClassSpec(**SPEC), ADMIN, now)
        register(session, RegisterRequest(node="n1", url="http://n1", capacity={"engines": 4, "kv_mib": 1}), now)
        set_deployment(session, "chat", DeploymentSet(class_ref="chat@r1", replicas=2), ADMIN, now)


def test_only_one_of_two_controllers_reconciles(pg_url: str, tmp_path: Path) -> None:
    first, second = runtime(pg_url, tmp_path / "a"), runtime(pg_url, tmp_path / "b")
    try:
        seed(first)
        results = [(first.step(), second.step()) for _ in range(3)]
        assert all(a is not None and b is None for a, b in results)
        assert (first.is_leader, second.is_leader) == (True, False)
        assert (first.passes, second.passes) == (3, 0)
        with first.store.session() as session:
            assert [a.name for a in current_plan(session)["n1"]] == ["chat-0", "chat-1"]

        first.election.release()  # the leader goes away (its connection closes, the lock is freed)
        assert second.step() is not None and second.is_leader
        assert first.election.ensure() is False  # and the old leader now follows
    finally:
        first.stop()
        second.stop()


def test_sqlite_is_always_leader(tmp_path: Path) -> None:
    instance = runtime(f"sqlite:///{tmp_path / 'fleet.db'}", tmp_path)
    try:
        assert instance.step() is not None and instance.is_leader
    finally:
        instance.stop()


def test_a_released_lock_is_free_at_once(pg_url: str) -> None:
    """Stepping down unlocks before closing: a closed connection frees the lock only once the server's backend
    has exited, which on a loaded machine can be after the follower's next try."""
    engine = create_engine(pg_url)
    try:
        for _ in range(50):
            leader, follower = AdvisoryLockLeader(engine), AdvisoryLockLeader(engine)
            assert leader.ensure() and not follower.ensure()
            leader.release()
            assert follower.ensure(), "the follower could not take the lock its leader had just released"
            follower.release()
    finally:
        engine.dispose()

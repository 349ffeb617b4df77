"""plan_actions: the agent's reconcile diff, a pure function of (desired, observed)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agent.plan import Action, plan_actions
from engine.contract import EngineAssignment, EngineObserved

SPEC = {"model": "tiny", "weights": "tiny"}


def want(name: str, class_ref: str = "tiny@r1", role: str = "mixed", drain: bool = False) -> EngineAssignment:
    return EngineAssignment(name=name, model="tiny", class_ref=class_ref, spec=SPEC, role=role, drain=drain)


def seen(name: str, state: str, class_ref: str = "tiny@r1", role: str = "mixed") -> EngineObserved:
    return EngineObserved(name=name, model="tiny", class_ref=class_ref, role=role, state=state)


def kinds(actions: list[Action]) -> list[tuple[str, str]]:
    return [(a.kind, a.name) for a in actions]


def test_nothing_to_do_when_the_world_matches():
    assert plan_actions([want("d-0")], [seen("d-0", "ready")]) == []
    assert plan_actions([want("d-0")], [seen("d-0", "starting")]) == []
    assert plan_actions([], []) == []


def test_missing_and_stopped_engines_are_started():
    actions = plan_actions([want("d-0"), want("d-1")], [seen("d-1", "stopped")])
    assert kinds(actions) == [("start", "d-0"), ("start", "d-1")]
    assert actions[0].assignment == want("d-0")


def test_class_or_role_change_restarts_with_the_new_assignment():
    actions = plan_actions([want("d-0", class_ref="tiny@r2"), want("d-1", role="prefill")],
                           [seen("d-0", "ready"), seen("d-1", "starting")])
    assert kinds(actions) == [("restart", "d-0"), ("restart", "d-1")]
    assert actions[0].assignment.class_ref == "tiny@r2"


def test_failed_engine_is_restarted():
    assert kinds(plan_actions([want("d-0")], [seen("d-0", "failed")])) == [("restart", "d-0")]


def test_draining_engine_is_left_to_finish_even_if_it_should_run():
    assert plan_actions([want("d-0")], [seen("d-0", "draining")]) == []
    assert plan_actions([want("d-0", class_ref="tiny@r2")], [seen("d-0", "draining")]) == []


def test_drain_flag_drains_running_engines_once():
    assert kinds(plan_actions([want("d-0", drain=True)], [seen("d-0", "ready")])) == [("drain", "d-0")]
    assert kinds(plan_actions([want("d-0", drain=True)], [seen("d-0", "starting")])) == [("drain", "d-0")]
    for state in ("draining", "stopped", "failed"):
        assert plan_actions([want("d-0", drain=True)], [seen("d-0", state)]) == []
    assert plan_actions([want("d-0", drain=True)], []) == []  # nothing is started only to be drained


def test_unassigned_engines_are_stopped_unless_already_ending():
    observed = [seen("x", "ready"), seen("y", "starting"), seen("z", "failed"), seen("w", "draining"), seen("v", "stopped")]
    assert kinds(plan_actions([], observed)) == [("stop", "x"), ("stop", "y"), ("stop", "z")]


names = st.sampled_from(["a-0", "a-1", "b-0"])
states = st.sampled_from(["starting", "ready", "draining", "stopped", "failed"])
desired_lists = st.lists(st.builds(want, names, st.sampled_from(["c@r1", "c@r2"]), st.sampled_from(["mixed", "decode"]),
                                   st.booleans()), unique_by=lambda a: a.name)
observed_lists = st.lists(st.builds(seen, names, states, st.sampled_from(["c@r1", "c@r2"]), st.sampled_from(["mixed", "decode"])),
                          unique_by=lambda o: o.name)


@given(desired_lists, observed_lists)
def test_plan_is_deterministic_and_touches_each_engine_at_most_once(desired, observed):
    actions = plan_actions(desired, observed)
    assert actions == plan_actions(desired, observed)
    assert len({a.name for a in actions}) == len(actions)


@given(desired_lists, observed_lists)
def test_acting_converges(desired, observed):
    """Apply each action's immediate effect as the supervisor would; the next plan has nothing to start,
    drain or stop twice: every second-pass action is a consequence of an engine still ending."""
    effect = {"start": "starting", "restart": "draining", "drain": "draining", "stop": "draining"}
    after = {o.name: o for o in observed}
    for action in plan_actions(desired, observed):
        old = after.get(action.name)
        assignment = action.assignment
        after[action.name] = seen(action.name, effect[action.kind],
                                  assignment.class_ref if assignment else old.class_ref,
                                  assignment.role if assignment else old.role)
    assert plan_actions(desired, list(after.values())) == []

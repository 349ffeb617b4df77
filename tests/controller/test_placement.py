"""plan_assignments: pure-function tests (placement by labels, capacity, spread, stability, cordon, drain,
down nodes keep their engines) and hypothesis properties."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.controller.placement import (
    DeploymentView,
    NodeView,
    PlannedEngine,
    changed_nodes,
    nodes_gone_quiet,
    plan_assignments,
)

CLASSES = {"chat@r1": object(), "chat@r2": object(), "code@r1": object()}


def dep(name: str = "chat", replicas: int = 1, class_ref: str = "chat@r1", role: str = "mixed", **placement: str) -> DeploymentView:
    return DeploymentView(name, "smollm2-135m", class_ref, role, replicas, placement)


def node(name: str, capacity: int = 4, **node_labels: str) -> NodeView:
    return NodeView(name=name, capacity_engines=capacity, labels=node_labels)


def names(plan: dict[str, list[PlannedEngine]], node_name: str, drain: bool | None = None) -> list[str]:
    return [a.name for a in plan[node_name] if drain is None or a.drain == drain]


def with_plan(nodes: list[NodeView], plan: dict[str, list[PlannedEngine]]) -> list[NodeView]:
    """The nodes as they look after the plan was stored (generation advanced where it changed)."""
    current = {n.name: n.assignments for n in nodes}
    changed = set(changed_nodes(current, plan))
    return [replace(n, assignments=tuple(plan[n.name]), generation=n.generation + (n.name in changed)) for n in nodes]


def test_places_by_labels() -> None:
    nodes = [node("a", gpu="none"), node("b", gpu="h100"), node("c", gpu="h100")]
    plan = plan_assignments([dep(replicas=2, gpu="h100")], CLASSES, nodes)
    assert names(plan, "a") == []
    assert names(plan, "b") + names(plan, "c") == ["chat-0", "chat-1"]


def test_respects_capacity_and_leaves_the_rest_pending() -> None:
    plan = plan_assignments([dep(replicas=5)], CLASSES, [node("a", capacity=1), node("b", capacity=2)])
    assert len(plan["a"]) == 1 and len(plan["b"]) == 2


def test_spreads_a_deployment_across_nodes() -> None:
    plan = plan_assignments([dep(replicas=3)], CLASSES, [node("a"), node("b"), node("c")])
    assert [len(plan[n]) for n in "abc"] == [1, 1, 1]


def test_spreads_by_load_when_deployments_share_nodes() -> None:
    plan = plan_assignments([dep("chat", replicas=2), dep("code", replicas=2, class_ref="code@r1")], CLASSES,
                            [node("a"), node("b")])
    assert sorted(a.deployment for a in plan["a"]) == ["chat", "code"]
    assert sorted(a.deployment for a in plan["b"]) == ["chat", "code"]


def test_existing_placements_stay_put() -> None:
    nodes = [node("a"), node("b")]
    first = plan_assignments([dep(replicas=2)], CLASSES, nodes)
    # a third, empty node joins; the spread would prefer it, but nothing moves
    second = plan_assignments([dep(replicas=2)], CLASSES, [*with_plan(nodes, first), node("c")])
    assert names(second, "a") == names(first, "a") and names(second, "b") == names(first, "b")
    assert names(second, "c") == []


def test_scale_up_adds_without_moving_and_scale_down_drains_highest_index() -> None:
    nodes = [node("a"), node("b")]
    first = plan_assignments([dep(replicas=2)], CLASSES, nodes)
    nodes = with_plan(nodes, first)
    up = plan_assignments([dep(replicas=4)], CLASSES, nodes)
    assert sorted(names(up, "a") + names(up, "b")) == ["chat-0", "chat-1", "chat-2", "chat-3"]
    assert set(names(first, "a")) <= set(names(up, "a"))
    down = plan_assignments([dep(replicas=1)], CLASSES, with_plan(nodes, up))
    drained = sorted(names(down, "a", drain=True) + names(down, "b", drain=True))
    assert drained == ["chat-1", "chat-2", "chat-3"]


def test_cordoned_node_keeps_engines_but_gets_no_new_ones() -> None:
    nodes = [node("a"), node("b")]
    first = plan_assignments([dep(replicas=1)], CLASSES, nodes)
    holder = "a" if first["a"] else "b"
    nodes = [replace(n, cordoned=True) for n in with_plan(nodes, first)]
    plan = plan_assignments([dep(replicas=3)], CLASSES, nodes)
    assert names(plan, holder) == names(first, holder)
    assert sum(len(v) for v in plan.values()) == 1  # nowhere to put the other two


def test_down_node_keeps_its_engines_and_they_are_not_replaced() -> None:
    nodes = [node("a"), node("b")]
    first = plan_assignments([dep(replicas=2)], CLASSES, nodes)
    nodes = [replace(n, state="down") if n.name == "a" else n for n in with_plan(nodes, first)]
    plan = plan_assignments([dep(replicas=2)], CLASSES, nodes)
    assert plan == first


def test_down_node_keeps_drained_engines_until_it_reports() -> None:
    a = NodeView("a", state="down", assignments=(PlannedEngine("chat-0", "chat", "m", "chat@r1", "mixed", drain=True),),
                 generation=3, applied_generation=3)
    plan = plan_assignments([], CLASSES, [a])
    assert names(plan, "a", drain=True) == ["chat-0"]


def test_drained_node_engines_drain_and_get_replacements_elsewhere() -> None:
    nodes = [node("a"), node("b")]
    first = plan_assignments([dep(replicas=1)], CLASSES, [nodes[0]] + [replace(nodes[1], cordoned=True)])
    assert names(first, "a") == ["chat-0"]
    nodes = [replace(n, cordoned=True, draining=True) if n.name == "a" else n for n in with_plan(nodes, first)]
    plan = plan_assignments([dep(replicas=1)], CLASSES, nodes)
    assert names(plan, "a", drain=True) == ["chat-0"]
    assert names(plan, "b", drain=False) == ["chat-1"]


def test_drained_assignment_is_dropped_once_stopped() -> None:
    drained = PlannedEngine("chat-0", "chat", "m", "chat@r1", "mixed", drain=True)
    running = NodeView("a", assignments=(drained,), observed={"chat-0": "draining"}, generation=2, applied_generation=2)
    assert names(plan_assignments([], CLASSES, [running]), "a") == ["chat-0"]
    stopped = replace(running, observed={"chat-0": "stopped"})
    assert names(plan_assignments([], CLASSES, [stopped]), "a") == []
    # not reported, but the agent has not applied the drain yet: keep it
    unapplied = replace(running, observed={}, applied_generation=1)
    assert names(plan_assignments([], CLASSES, [unapplied]), "a") == ["chat-0"]


def test_class_change_drains_old_engines_and_places_new_ones() -> None:
    nodes = [node("a", capacity=2)]
    first = plan_assignments([dep(replicas=1)], CLASSES, nodes)
    plan = plan_assignments([dep(replicas=1, class_ref="chat@r2")], CLASSES, with_plan(nodes, first))
    assert [(a.name, a.class_ref, a.drain) for a in plan["a"]] == [("chat-0", "chat@r1", True), ("chat-1", "chat@r2", False)]


def test_deleted_deployment_engines_drain() -> None:
    nodes = [node("a")]
    first = plan_assignments([dep(replicas=2)], CLASSES, nodes)
    plan = plan_assignments([], CLASSES, with_plan(nodes, first))
    assert names(plan, "a", drain=True) == ["chat-0", "chat-1"]


def test_label_change_makes_placement_invalid() -> None:
    nodes = [node("a", zone="x"), node("b", zone="y")]
    first = plan_assignments([dep(replicas=1, zone="x")], CLASSES, nodes)
    plan = plan_assignments([dep(replicas=1, zone="y")], CLASSES, with_plan(nodes, first))
    assert names(plan, "a", drain=True) == ["chat-0"] and names(plan, "b") == ["chat-1"]


def test_unknown_class_gets_no_engines() -> None:
    assert plan_assignments([dep(class_ref="ghost@r1")], CLASSES, [node("a")]) == {"a": []}


def test_names_are_not_reused_while_reported() -> None:
    a = NodeView("a", observed={"chat-0": "stopped"})
    plan = plan_assignments([dep(replicas=1)], CLASSES, [a])
    assert names(plan, "a") == ["chat-1"]


def test_nodes_gone_quiet() -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows = [("a", "up", now - timedelta(seconds=20)), ("b", "up", now - timedelta(seconds=5)), ("c", "down", now - timedelta(days=1))]
    assert nodes_gone_quiet(rows, now, 15) == ["a"]


# --- properties ---

labels = st.sampled_from([{}, {"gpu": "h100"}, {"zone": "x"}])
node_lists = st.lists(
    st.builds(lambda i, cap, lab, state, cordoned: NodeView(f"n{i}", lab, cap, state, cordoned),
              st.integers(0, 50), st.integers(0, 4), labels, st.sampled_from(["up", "up", "down"]), st.booleans()),
    min_size=0, max_size=6, unique_by=lambda n: n.name,
)
deployment_lists = st.lists(
    st.builds(lambda i, replicas, lab: DeploymentView(f"d{i}", "m", "chat@r1", "mixed", replicas, lab),
              st.integers(0, 5), st.integers(0, 6), labels),
    max_size=4, unique_by=lambda d: d.name,
)


@settings(max_examples=150, deadline=None)
@given(nodes=node_lists, deployments=deployment_lists)
def test_properties_of_a_fresh_plan(nodes: list[NodeView], deployments: list[DeploymentView]) -> None:
    plan = plan_assignments(deployments, CLASSES, nodes)
    by_name = {n.name: n for n in nodes}
    wanted = {d.name: d for d in deployments}
    all_names = [a.name for assignments in plan.values() for a in assignments]
    assert len(all_names) == len(set(all_names))  # engine names are unique fleet-wide
    for node_name, assignments in plan.items():
        n = by_name[node_name]
        assert len(assignments) <= n.capacity_engines  # capacity
        if assignments:
            assert n.schedulable  # nothing new on down or cordoned nodes
        for a in assignments:
            assert all(n.labels.get(k) == v for k, v in wanted[a.deployment].placement.items())  # labels
    for d in deployments:
        assert sum(a.deployment == d.name for assignments in plan.values() for a in assignments) <= d.replicas


@settings(max_examples=150, deadline=None)
@given(nodes=node_lists, deployments=deployment_lists)
def test_replanning_a_stored_plan_changes_nothing(nodes: list[NodeView], deployments: list[DeploymentView]) -> None:
    first = plan_assignments(deployments, CLASSES, nodes)
    stored = with_plan(nodes, first)
    assert plan_assignments(deployments, CLASSES, stored) == first
    assert changed_nodes({n.name: n.assignments for n in stored}, first) == []

"""The runner on plain surroundings: checks poll until they hold or time out (on a clock the test moves),
a failure stops the run with what to do next and runs the rollback, questions set variables, and every
start, step and finish is audited."""

from __future__ import annotations

from runbook_helpers import Scripted, outcomes

MAINTAIN = """\
id: maintain
title: maintain a node
vars:
  node: {description: the node}
  done: {description: "done?"}
steps:
  - say: "cordon {node}"
  - run: 'fleetctl node cordon {node} --yes --reason "{runbook} {run_id}"'
  - check: fleetctl node show {node}
    path: cordoned
    expect: true
    timeout_s: 10
    interval_s: 2
    on_fail: "see fleetctl node show {node}"
  - ask: "done with {node}?"
    var: done
    choices: [yes, no]
    continue_if: yes
  - run: fleetctl node uncordon {node}
rollback:
  - run: fleetctl node uncordon {node} --reason rollback
"""


def test_a_check_polls_until_it_holds_and_the_run_completes() -> None:
    io = Scripted(replies=["yes"])
    io.answers["node show n1 -o json"] = lambda n: (0, {"cordoned": n >= 3})
    result = io.run(MAINTAIN, {"node": "n1"}, interactive=False)
    assert result.outcome == "completed" and result.rollback == "not_needed"
    assert io.ran[0] == ["fleetctl", "node", "cordon", "n1", "--yes", "--reason", "maintain r1"]
    check = result.steps[2]
    assert (check.outcome, check.attempts) == ("ok", 3) and io.now == 4.0  # two waits of interval_s
    assert io.ran[-1] == ["fleetctl", "node", "uncordon", "n1"]
    assert result.vars == {"node": "n1", "done": "yes"} and io.asked == ["done with n1?"]


def test_a_check_that_times_out_stops_the_run_says_what_next_and_rolls_back() -> None:
    io = Scripted()
    io.answers["node show n1 -o json"] = lambda _n: (0, {"cordoned": False})
    result = io.run(MAINTAIN, {"node": "n1", "done": "yes"}, interactive=False)
    assert result.outcome == "failed" and result.next_action == "see fleetctl node show n1"
    failed = result.steps[2]
    assert failed.outcome == "failed" and "got false, want == true after 10s (6 tries)" in failed.detail
    assert io.now == 10.0  # it never sleeps past the deadline
    assert outcomes(result)[-1] == ("rollback", 1, "ok") and result.rollback == "completed"
    assert io.ran[-1] == ["fleetctl", "node", "uncordon", "n1", "--reason", "rollback"]
    assert ["fleetctl", "node", "uncordon", "n1"] not in io.ran  # the steps after the failure did not run


def test_interactively_the_rollback_is_offered_and_can_be_declined() -> None:
    io = Scripted(rollback=False)
    io.answers["node cordon n1 --yes --reason maintain r1"] = lambda _n: (5, "node n1 is draining")
    result = io.run(MAINTAIN, {"node": "n1"}, interactive=True)
    assert result.outcome == "failed" and result.rollback == "declined"
    assert result.steps[-1].detail == "exit 5: error: node n1 is draining"
    assert "runbook stopped at steps step 2 (run)" in (result.next_action or "")


def test_the_operator_skips_a_step_and_aborts_the_next() -> None:
    io = Scripted(decisions=["skip", "abort"], rollback=True)
    result = io.run(MAINTAIN, {"node": "n1"}, interactive=True)
    assert outcomes(result)[:3] == [("steps", 1, "ok"), ("steps", 2, "skipped"), ("steps", 3, "aborted")]
    assert result.outcome == "aborted" and result.rollback == "completed"
    assert io.ran == [["fleetctl", "node", "uncordon", "n1", "--reason", "rollback"]]


def test_an_answer_other_than_continue_if_stops_without_rollback() -> None:
    io = Scripted(replies=["no"])
    io.answers["node show n1 -o json"] = lambda _n: (0, {"cordoned": True})
    result = io.run(MAINTAIN, {"node": "n1"}, interactive=True)
    assert result.outcome == "stopped" and result.rollback == "not_needed"
    assert result.steps[-1].detail == "answered 'no'"


def test_a_failed_precondition_changes_nothing_and_offers_no_rollback() -> None:
    text = MAINTAIN.replace("steps:\n", "preconditions:\n  - check: fleetctl node show {node}\n    path: state\n"
                                        "    expect: up\nsteps:\n", 1)
    io = Scripted()
    io.answers["node show n1 -o json"] = lambda _n: (0, {"state": "down", "cordoned": False})
    result = io.run(text, {"node": "n1", "done": "yes"}, interactive=False)
    assert result.outcome == "precondition_failed" and result.rollback == "not_needed"
    assert "nothing was changed" in (result.next_action or "")
    assert [a[1:3] for a in io.ran] == [["node", "show"]]


def test_every_start_step_and_finish_is_audited_with_its_outcome() -> None:
    io = Scripted()
    io.answers["node show n1 -o json"] = lambda _n: (0, {"cordoned": False})
    io.run(MAINTAIN, {"node": "n1", "done": "yes"}, interactive=False)
    events = [(e.event, e.phase, e.step, e.outcome) for e in io.audited]
    assert events == [("start", None, None, "started"), ("step", "steps", 1, "ok"), ("step", "steps", 2, "ok"),
                      ("step", "steps", 3, "failed"), ("step", "rollback", 1, "ok"), ("finish", None, None, "failed")]
    assert {e.run_id for e in io.audited} == {"r1"}
    assert io.audited[2].text == "fleetctl node cordon n1 --yes --reason 'maintain r1'"


def test_a_dry_run_runs_nothing_records_nothing_and_shows_every_step_filled() -> None:
    io = Scripted()
    result = io.run(MAINTAIN, {"node": "n1"}, dry_run=True)
    assert result.outcome == "dry_run" and io.ran == [] and io.audited == []
    assert {s.outcome for s in result.steps} == {"dry_run"} and len(result.steps) == 6
    assert result.steps[2].text == "fleetctl node show n1 -o json: cordoned == true"
    assert result.steps[3].text == "done with n1?"


def test_check_paths_lengths_maps_and_expect_path() -> None:
    text = """\
id: paths
title: paths
vars:
  want: {description: replicas, default: "2"}
steps:
  - check: fleetctl status
    path: deployments.*.ready
    expect_path: deployments.*.replicas
  - check: fleetctl status
    path: deployments.#
    op: gte
    expect: "{want}"
  - check: fleetctl status
    path: deployments.0.name
    op: in
    expect: [web, chat]
  - check: fleetctl status
    path: deployments.1.nope
    expect: 1
"""
    io = Scripted()
    io.answers["status -o json"] = lambda _n: (0, {"deployments": [{"name": "chat", "ready": 2, "replicas": 2},
                                                                  {"name": "b", "ready": 1, "replicas": 1}]})
    result = io.run(text, {"want": "2"}, interactive=False)
    assert outcomes(result) == [("steps", 1, "ok"), ("steps", 2, "ok"), ("steps", 3, "ok"), ("steps", 4, "failed")]
    assert result.steps[3].detail.startswith("deployments.1.nope: no 'nope' (keys: name, ready, replicas)")

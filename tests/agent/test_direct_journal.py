"""The direct-action journal (engine.contract.direct) and the agent's direct holds: entries are appended
with increasing sequence numbers and read back after a restart (a line cut short by a crash is skipped);
`pending` is what the controller has not acknowledged; a drain held by a direct action outlives new
assignments until it is released, and a reverted one restarts the engine."""

from __future__ import annotations

from pathlib import Path

from agent.direct_sync import DirectSync
from agent.settings import AgentSettings
from agent.supervisor import Supervisor
from engine.contract import EngineAssignment
from engine.contract.direct import DirectJournal, bearer_problem, ensure_credential

SPEC = {"model": "tiny", "weights": "tiny", "backend": "reference", "kv_cache_mib": 16, "max_model_len": 256}
CLEAN = EngineAssignment(name="tiny-0", model="tiny", class_ref="tiny@r1", spec=SPEC)


def test_entries_survive_a_restart_and_pending_follows_the_acknowledgement(tmp_path: Path) -> None:
    journal = DirectJournal(tmp_path)
    journal.append("drain", "chat-0", reason="bad host", now=100.0)
    journal.append("restart", "chat-0", now=101.0)
    with open(journal.path, "a") as handle:
        handle.write('{"seq": 3, "at": 1')  # a crash mid-write
    reopened = DirectJournal(tmp_path)
    assert [(e.seq, e.action, e.reason) for e in reopened.entries()] == [(1, "drain", "bad host"), (2, "restart", None)]
    reopened.mark_uploaded(1)
    assert [e.seq for e in DirectJournal(tmp_path).pending()] == [2]


def test_a_credential_is_written_once_and_compared_whole(tmp_path: Path) -> None:
    path = tmp_path / "bg"
    first = ensure_credential(path)
    assert ensure_credential(path) == first and oct(path.stat().st_mode & 0o777) == "0o600"
    assert bearer_problem(f"Bearer {first}", first) is None
    assert bearer_problem(f"Bearer {first[:-1]}", first) is not None
    assert bearer_problem(first, first) is not None  # no scheme
    assert bearer_problem(None, first) is not None


class Link:
    """The controller's side of the upload, as a recorded reply (the API is tested in tests/controller)."""

    def __init__(self, reply: dict):
        self.reply = reply
        self.sent: list[dict] = []

    async def upload_direct_actions(self, payload: dict) -> dict:
        self.sent.append(payload)
        return self.reply


async def test_a_direct_hold_outlives_new_assignments_until_the_operator_resolves_it(tmp_path: Path) -> None:
    settings = AgentSettings(controller_url="http://127.0.0.1:1", node="n1", state_dir=tmp_path)
    supervisor = Supervisor(settings)
    journal = DirectJournal(settings.direct_dir)
    entry = journal.append("drain", CLEAN.name)
    supervisor.held[CLEAN.name] = entry.seq
    supervisor.set_desired([CLEAN])  # a new generation from the controller: the hold stays
    assert [a.drain for a in supervisor.effective_desired()] == [True]

    link = Link({"acknowledged": 1, "resolved": {}})
    sync = DirectSync(link, "n1", journal, supervisor)
    await sync.sync()
    assert link.sent[-1]["actions"][0]["action"] == "drain" and link.sent[-1]["open"] == [1]
    assert journal.pending() == [] and supervisor.held == {CLEAN.name: 1}

    link.reply = {"acknowledged": 1, "resolved": {"1": "adopted"}}
    await sync.sync()
    assert link.sent[-1]["actions"] == [] and supervisor.held == {}
    assert [a.drain for a in supervisor.effective_desired()] == [False]
    await sync.sync()
    assert len(link.sent) == 2  # nothing pending, nothing held: nothing sent
    await supervisor._http.aclose()

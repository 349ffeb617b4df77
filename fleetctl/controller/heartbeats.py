"""Heartbeats, written behind: a beat is answered from memory and stored with the others in one batch.

Every node beats every interval, so at 1,000 nodes the beat is the controller's whole load. Written through,
each beat was its own transaction (update the node, replace its engines, read its assignment and class
specs: five statements and a commit, ~3 ms of controller CPU plus the database's), which capped a 2-core
machine at a few hundred beats a second. Here:

- `accept` answers a beat of a node known to be up from the node's cached (generation, assignment) and
  queues the beat (the latest per node wins); nothing touches the database on the request path.
- `flush` (every `flush_interval_s` from the runtime's thread, and before anything reads the fleet) writes
  the queued beats in one transaction: the nodes' heartbeat columns in one executemany, their engines
  replaced in one DELETE and one executemany INSERT. It then re-reads every node's (state, generation) and,
  for nodes whose generation moved, their assignments, which refreshes the cache.
- A node the cache does not know as up (first beat after a controller start, a node that was down, one not
  registered) takes the synchronous path (`nodes.heartbeat`), which also primes the cache. So does every node
  after a change made through this controller (`forget`: any successful mutating call, the nodes a reconcile
  pass changed), so its agent sees the change on its next beat; changes made through another replica arrive
  with the next refresh.

Consistency. The generation is read before the assignment rows, and the reconciler and drains bump a node's
generation in the same transaction that writes its new assignment rows, so the cache can pair an older
generation with a newer assignment (the agent reports the older generation applied; the next refresh sends
the newer one with the same rows) but never a newer generation with an older assignment, which would make
an agent believe it had applied rows it never saw. A reply's assignment is at most one flush interval older
than the database. Reads through this controller see every beat it accepted (the app flushes before any
other request); other replicas see them within a flush interval, far below the down-after time.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, delete, insert, select, update

from fleetctl.controller.contract import HeartbeatRequest
from fleetctl.controller.db import Store
from fleetctl.controller.models import Assignment, Engine, Node
from fleetctl.controller.nodes import UP, HeartbeatResult, _ASSIGNMENT_ROWS, to_assignment

log = logging.getLogger(__name__)

_NODES, _ENGINES = Node.__table__, Engine.__table__

_WRITE_BEAT = (
    update(_NODES)
    .where(_NODES.c.name == bindparam("b_node"))
    .values(state=UP, last_heartbeat_at=bindparam("b_at"), applied_generation=bindparam("b_applied"),
            cut_off_s=bindparam("b_cut_off"))
)


@dataclass(frozen=True)
class CachedNode:
    state: str
    generation: int
    assignment_json: str  # the reply's assignment, serialised once per generation


def reply_body(generation: int, assignment_json: str, interval_s: float) -> bytes:
    """The heartbeat reply (contract.HeartbeatResponse) without re-serialising the cached assignment."""
    return f'{{"generation":{generation},"assignment":{assignment_json},"heartbeat_interval_s":{json.dumps(interval_s)}}}'.encode()


class HeartbeatBuffer:
    def __init__(self, store: Store, on_came_back: Callable[[], None]):
        self.store = store
        self.on_came_back = on_came_back  # a node that was down beat again: placement may change
        self._pending: dict[str, tuple[HeartbeatRequest, datetime]] = {}
        self._nodes: dict[str, CachedNode] = {}
        self._lock = threading.Lock()  # guards _pending and _nodes (accept runs on the event loop)
        self._flush_lock = threading.Lock()  # one flush at a time
        self.flushes = 0
        self.beats_written = 0

    @property
    def pending(self) -> int:
        return len(self._pending)

    # --- the request path ---

    def accept(self, req: HeartbeatRequest, now: datetime) -> CachedNode | None:
        """The cached reply for a node known to be up, with the beat queued; None: take the synchronous path."""
        with self._lock:
            cached = self._nodes.get(req.node)
            if cached is None or cached.state != UP:
                return None
            self._pending[req.node] = (req, now)
            return cached

    def remember(self, node: str, result: HeartbeatResult) -> CachedNode:
        """Prime the cache from a synchronous beat (the node is up now)."""
        cached = CachedNode(UP, result.generation, json.dumps(result.assignment, separators=(",", ":")))
        with self._lock:
            self._nodes[node] = cached
        return cached

    def forget(self, nodes: Iterable[str] | None = None) -> None:
        """Drop cached replies (all when `nodes` is None): a change made through this controller (a drain, a
        reconcile pass, a new deployment) reaches those agents on their next beat, by the synchronous path,
        rather than after the next refresh. Queued beats stay queued."""
        with self._lock:
            if nodes is None:
                self._nodes.clear()
                return
            for node in nodes:
                self._nodes.pop(node, None)

    # --- the batch ---

    def flush(self) -> int:
        """Write the queued beats and refresh the cache, in one transaction. Returns the beats written."""
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, {}
            try:
                written, came_back = self._write_and_refresh(pending)
            except BaseException:
                with self._lock:  # put them back (newer beats queued meanwhile win): nothing is lost
                    for node, beat in pending.items():
                        self._pending.setdefault(node, beat)
                raise
            self.flushes += 1
            self.beats_written += written
        if came_back:
            log.info("%d node(s) beat again after being down: %s", len(came_back), ", ".join(sorted(came_back)[:5]))
            self.on_came_back()
        return written

    def _write_and_refresh(self, pending: dict[str, tuple[HeartbeatRequest, datetime]]) -> tuple[int, list[str]]:
        with self.store.session() as session:
            before = {row.name: (row.state, row.generation)
                      for row in session.execute(select(_NODES.c.name, _NODES.c.state, _NODES.c.generation))}
            beats = [(req, at) for node, (req, at) in pending.items() if node in before]  # deleted nodes: dropped
            if beats:
                session.execute(_WRITE_BEAT, [{"b_node": req.node, "b_at": at, "b_applied": req.generation,
                                               "b_cut_off": req.cut_off_s} for req, at in beats])
                session.execute(delete(_ENGINES).where(_ENGINES.c.node.in_([req.node for req, _ in beats])))
                rows = list(engine_rows(beats))
                if rows:
                    session.execute(insert(_ENGINES), rows)
            came_back = [req.node for req, _ in beats if before[req.node][0] != UP]
            states = {name: (UP if name in pending else state, generation) for name, (state, generation) in before.items()}
            assignments = self._changed_assignments(session, states)
        self._refresh(states, assignments)
        return len(beats), came_back

    def _changed_assignments(self, session: Any, states: dict[str, tuple[str, int]]) -> dict[str, str]:
        """Serialised assignments of the up nodes whose generation is not the cached one."""
        with self._lock:
            stale = [name for name, (state, generation) in states.items()
                     if state == UP and (name not in self._nodes or self._nodes[name].generation != generation)]
        if not stale:
            return {}
        by_node: dict[str, list[dict[str, Any]]] = {name: [] for name in stale}
        for chunk in chunks(stale, 500):
            query = _ASSIGNMENT_ROWS.add_columns(Assignment.node).where(Assignment.node.in_(chunk)).order_by(Assignment.name)
            for row in session.execute(query).all():
                by_node[row.node].append(to_assignment(row).to_contract(row.spec))
        return {name: json.dumps(rows, separators=(",", ":")) for name, rows in by_node.items()}

    def _refresh(self, states: dict[str, tuple[str, int]], assignments: dict[str, str]) -> None:
        with self._lock:
            for name in list(self._nodes):
                if name not in states:
                    del self._nodes[name]  # deleted: its next beat takes the synchronous path (404)
            for name, (state, generation) in states.items():
                if name in assignments:
                    self._nodes[name] = CachedNode(state, generation, assignments[name])
                elif name in self._nodes:
                    cached = self._nodes[name]
                    if state != UP:
                        self._nodes[name] = CachedNode(state, cached.generation, cached.assignment_json)
                    elif cached.state != UP and cached.generation == generation:
                        self._nodes[name] = CachedNode(UP, generation, cached.assignment_json)


def engine_rows(beats: Iterable[tuple[HeartbeatRequest, datetime]]) -> Iterable[dict[str, Any]]:
    for req, at in beats:
        for engine in req.engines:
            yield {**engine.model_dump(exclude={"metrics"}), "metrics": engine.metrics.model_dump(), "node": req.node,
                   "updated_at": at}


def chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]

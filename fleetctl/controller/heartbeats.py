"""Heartbeats, written behind: a beat is answered from memory and stored with the others in one batch.

Every node beats every interval, so at 1,000 nodes the beat is the controller's whole load. Written through,
each beat was its own transaction (update the node, replace its engines, read its assignment and class
specs: five statements and a commit, ~3 ms of controller CPU plus the database's), which capped a 2-core
machine at a few hundred beats a second. Here:

- `accept` answers a beat of a node known to be up from the node's cached (generation, assignment) and
  queues the beat (the latest per node wins); nothing touches the database on the request path.
- `flush` (every `flush_interval_s` from the runtime's thread, and before anything reads the fleet) writes
  the queued beats in one transaction: the nodes' heartbeat columns in one executemany, and the engines of
  the nodes whose engines changed (or whose stored metrics are `metrics_refresh_s` old) replaced in one
  DELETE and one executemany INSERT. It then re-reads every node's (state, generation) and,
  for nodes whose generation moved, their assignments, which refreshes the cache.
- A node the cache does not know (one registered since the last refresh, one not registered) takes the
  synchronous path (`nodes.heartbeat`), which also primes the cache. A node that was down is answered from
  the cache like any other (its assignment does not change while it is down); the flush marks it up and
  wakes the reconciler.
- A change made through this controller (any successful mutating call, a reconcile pass that changed
  nodes) is followed at once by a flush, whose refresh reloads the changed nodes' assignments in one query,
  so their agents see the change on their next beat. Changes made through another replica arrive with the
  next periodic flush. (Dropping the changed nodes from the cache instead sent each of their next beats
  down the synchronous path: after a deployment placed 1,000 engines, 1,000 single-beat transactions in
  one second, which overloaded the controller until nodes were marked down.)

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
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import bindparam, delete, insert, select, update
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from fleetctl.controller import audit, drill_effects, node_kv

from fleetctl.controller.contract import HeartbeatRequest
from fleetctl.controller.db import Store
from fleetctl.controller.models import Assignment
from fleetctl.controller.nodes import ASSIGNMENT_ROWS, ENGINES_TABLE, NODES_TABLE, UP, HeartbeatResult, observed_rows, to_assignment

log = logging.getLogger(__name__)

CONTROLLER = "controller"  # the audit actor of what the controller does by itself

_WRITE_BEAT = (
    update(NODES_TABLE)
    .where(NODES_TABLE.c.name == bindparam("b_node"))
    .values(state=UP, last_heartbeat_at=bindparam("b_at"), applied_generation=bindparam("b_applied"),
            cut_off_s=bindparam("b_cut_off"), kv_tiers=bindparam("b_kv_tiers"))
)


@dataclass(frozen=True)
class CachedNode:
    state: str
    generation: int
    assignment_json: str  # the reply's assignment, serialised once per generation
    kv_flush: dict[str, Any] | None = None  # a flush of its KV tiers not yet done (node_kv.py)
    kv_json: str = node_kv.directives_json(True, None)  # the reply's `kv`, serialised with the two above

    @classmethod
    def of(cls, result: HeartbeatResult, disk: bool) -> "CachedNode":
        """A synchronous beat's reply (the node is up now)."""
        return cls.build(UP, result.generation, json.dumps(result.assignment, separators=(",", ":")),
                         result.kv_flush, disk)

    @classmethod
    def build(cls, state: str, generation: int, assignment_json: str, kv_flush: dict[str, Any] | None,
              disk: bool) -> "CachedNode":
        return cls(state, generation, assignment_json, kv_flush, node_kv.directives_json(disk, kv_flush))


def reply_body(cached: CachedNode, interval_s: float) -> bytes:
    """The heartbeat reply (contract.HeartbeatResponse) without re-serialising the cached assignment."""
    return (f'{{"generation":{cached.generation},"assignment":{cached.assignment_json},'
            f'"heartbeat_interval_s":{json.dumps(interval_s)},"kv":{cached.kv_json}}}').encode()


class HeartbeatBuffer:
    def __init__(self, store: Store, on_came_back: Callable[[], None], metrics_refresh_s: float = 5.0,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 on_dropped: Callable[[str], None] = lambda _reason: None):
        self.store = store
        self.on_dropped = on_dropped  # a beat the store refused was dropped, for this reason (a metric)
        self.clock = clock
        self.on_came_back = on_came_back  # a node that was down beat again: placement may change
        self.metrics_refresh_s = metrics_refresh_s
        # per node: its engines as last written, metrics left out, and when (see `_engines_to_write`)
        self._written: dict[str, tuple[str, datetime]] = {}
        self._pending: dict[str, tuple[HeartbeatRequest, datetime]] = {}
        self._nodes: dict[str, CachedNode] = {}
        self._acked_flush: dict[str, int] = {}  # per node, the flush id whose done report was written
        self.disk = True  # the kv_tier_disk flag as of the last flush (every reply carries it)
        self._lock = threading.Lock()  # guards _pending and _nodes (accept runs on the event loop)
        self._flush_lock = threading.Lock()  # one flush at a time

    @property
    def pending(self) -> int:
        return len(self._pending)

    # --- the request path ---

    def accept(self, req: HeartbeatRequest, now: datetime) -> CachedNode | None:
        """The cached reply for a known node, with the beat queued; None: take the synchronous path. A node
        that was down keeps its assignment while down, so its beat is answered the same way; the flush marks
        it up and wakes the reconciler."""
        with self._lock:
            cached = self._nodes.get(req.node)
            if cached is None:
                return None
            self._pending[req.node] = (req, now)
            return cached

    def remember(self, req: HeartbeatRequest, result: HeartbeatResult, now: datetime) -> CachedNode:
        """Prime the cache from a synchronous beat (the node is up now; it wrote its engines)."""
        cached = CachedNode.of(result, self.disk)
        with self._lock:
            self._nodes[req.node] = cached
            self._written[req.node] = (engines_key(req), now)
        return cached

    # --- the batch ---

    def flush(self) -> int:
        """Write the queued beats and refresh the cache, in one transaction. Returns the beats written.

        If the batch fails for a reason other than the database being unreachable or busy (a value the store
        refuses), the beats are written one by one instead and the ones that still fail are dropped, each
        with a log line naming its node, an audit event and a count by reason (`on_dropped`): one bad beat
        must never keep the others, or any other call, from the store. An unreachable database keeps every
        beat queued for the next flush."""
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, {}
            try:
                try:
                    written, came_back = self._write_and_refresh(pending)
                except Exception as exc:
                    if is_transient(exc):
                        raise
                    log.warning("writing %d queued heartbeat(s) in one batch failed (%s); writing them one by one",
                                len(pending), type(exc).__name__)
                    written, came_back = self._write_each(pending)
            except BaseException:
                with self._lock:  # put them back (newer beats queued meanwhile win): nothing is lost
                    for node, beat in pending.items():
                        self._pending.setdefault(node, beat)
                raise
        if came_back:
            log.info("%d node(s) beat again after being down: %s", len(came_back), ", ".join(sorted(came_back)[:5]))
            self.on_came_back()
        return written

    def _write_and_refresh(self, pending: dict[str, tuple[HeartbeatRequest, datetime]]) -> tuple[int, list[str]]:
        with self.store.session() as session:
            before = node_states(session)
            beats = [(req, at) for node, (req, at) in pending.items() if node in before]  # deleted nodes: dropped
            written, acked = self._write_beats(session, beats)
            came_back = [req.node for req, _ in beats if before[req.node][0] != UP]
            advanced = {node for node, (_, cleared) in acked.items() if cleared}  # a cleared flush moved these
            states = {name: (UP if name in pending else state, generation + (name in advanced))
                      for name, (state, generation) in before.items()}
            assignments = self._changed_assignments(session, states)
            disk = node_kv.disk_enabled(session, self.clock())
        self._committed(written, acked)
        self._refresh(states, assignments, disk)
        return len(beats), came_back

    def _write_each(self, pending: dict[str, tuple[HeartbeatRequest, datetime]]) -> tuple[int, list[str]]:
        """The fallback of a failed batch: each beat in its own transaction, dropping those the store refuses."""
        with self.store.session() as session:
            before = node_states(session)
        stored: list[str] = []
        for node, (req, at) in pending.items():
            if node not in before:
                continue
            try:
                with self.store.session() as session:
                    written, acked = self._write_beats(session, [(req, at)])
            except Exception as exc:
                if is_transient(exc):
                    raise
                self._drop(req, exc)
                continue
            self._committed(written, acked)
            stored.append(node)
        with self.store.session() as session:
            states = node_states(session)
            assignments = self._changed_assignments(session, states)
            disk = node_kv.disk_enabled(session, self.clock())
        self._refresh(states, assignments, disk)
        return len(stored), [node for node in stored if before[node][0] != UP]

    def _write_beats(self, session: Any, beats: list[tuple[HeartbeatRequest, datetime]]
                     ) -> tuple[dict[str, Any], dict[str, tuple[int, bool]]]:
        """The nodes' heartbeat columns, and the engines of those whose engines must be rewritten. Returns
        what `_written` becomes once this transaction commits, and the flushes acknowledged (`_acknowledge_flushes`)."""
        if not beats:
            return {}, {}
        session.execute(_WRITE_BEAT, [{"b_node": req.node, "b_at": at, "b_applied": req.generation,
                                       "b_cut_off": req.cut_off_s, "b_kv_tiers": node_kv.tier_rows(req)}
                                      for req, at in beats])
        acked = self._acknowledge_flushes(session, beats)
        rewrite, written = self._engines_to_write(beats)
        if rewrite:
            session.execute(delete(ENGINES_TABLE).where(ENGINES_TABLE.c.node.in_([req.node for req, _ in rewrite])))
            rows = [row for req, at in rewrite for row in observed_rows(req, at)]
            if rows:
                session.execute(insert(ENGINES_TABLE), rows)
        return written, acked

    def _acknowledge_flushes(self, session: Any, beats: list[tuple[HeartbeatRequest, datetime]]
                             ) -> dict[str, tuple[int, bool]]:
        """Flushes reported done and not yet looked at (an agent reports its last one on every beat): cleared
        on their nodes when pending (node_kv.acknowledge_flush, which advances the node's generation).
        Returns node -> (flush id, whether it was cleared)."""
        with self._lock:
            new = [(req, at) for req, at in beats
                   if req.kv_flushed is not None and self._acked_flush.get(req.node) != req.kv_flushed.id]
        return {req.node: (req.kv_flushed.id, node_kv.acknowledge_flush(session, req.node, req.kv_flushed, at))
                for req, at in new}

    def _committed(self, written: dict[str, Any], acked: dict[str, tuple[int, bool]]) -> None:
        with self._lock:  # committed: now they count as written
            self._written.update(written)
            self._acked_flush.update({node: flush_id for node, (flush_id, _) in acked.items()})

    def _drop(self, req: HeartbeatRequest, exc: Exception) -> None:
        reason = drop_reason(exc)
        self.on_dropped(reason)
        log.error("dropped the heartbeat of node %r: the store refused it (%s: %s)", req.node, reason,
                  " ".join(str(exc).split())[:300])
        entry = audit.AuditRecord(actor=CONTROLLER, action="agent.heartbeat", target=req.node, reason=None,
                                  payload_digest="", result=audit.ERROR, status=500, code="heartbeat_dropped",
                                  detail={"reason": reason})
        try:
            with self.store.session() as session:
                audit.record(session, entry, self.clock())
        except Exception:
            log.exception("could not record the audit event of a dropped heartbeat")

    def _engines_to_write(self, beats: list[tuple[HeartbeatRequest, datetime]]) -> tuple[list[tuple[HeartbeatRequest, datetime]], dict[str, Any]]:
        """The beats whose engines must be rewritten: any change but the metrics (state, pid, an engine came or
        went), or metrics last written `metrics_refresh_s` ago (metrics are a live sample for `status`;
        writing them on every beat was most of a flush's cost). And what `_written` becomes once committed."""
        rewrite, written = [], {}
        with self._lock:
            last_written = {req.node: self._written.get(req.node) for req, _ in beats}
        for req, at in beats:
            engines = engines_key(req)
            last = last_written[req.node]
            if last is None or last[0] != engines or (at - last[1]).total_seconds() >= self.metrics_refresh_s:
                rewrite.append((req, at))
                written[req.node] = (engines, at)
        return rewrite, written

    def _changed_assignments(self, session: Any, states: dict[str, tuple[str, int]]
                             ) -> dict[str, tuple[str, dict[str, Any] | None]]:
        """Serialised assignments (and pending KV flushes) of the nodes whose generation is not the cached one."""
        with self._lock:
            stale = [name for name, (_, generation) in states.items()
                     if name not in self._nodes or self._nodes[name].generation != generation]
        if not stale:
            return {}
        by_node: dict[str, list[dict[str, Any]]] = {name: [] for name in stale}
        faults = drill_effects.planted_faults(session)  # plant drills in effect: a handful at most
        for chunk in chunks(stale, 500):
            query = ASSIGNMENT_ROWS.add_columns(Assignment.node).where(Assignment.node.in_(chunk)).order_by(Assignment.name)
            for row in session.execute(query).all():
                by_node[row.node].append(to_assignment(row).to_contract(row.spec, faults.get(row.name)))
        flushes: dict[str, Any] = {}
        for chunk in chunks(stale, 500):
            query = select(NODES_TABLE.c.name, NODES_TABLE.c.kv_flush).where(NODES_TABLE.c.name.in_(chunk))
            flushes.update({row.name: row.kv_flush for row in session.execute(query)})
        return {name: (json.dumps(rows, separators=(",", ":")), flushes.get(name)) for name, rows in by_node.items()}

    def _refresh(self, states: dict[str, tuple[str, int]],
                 assignments: dict[str, tuple[str, dict[str, Any] | None]], disk: bool) -> None:
        with self._lock:
            disk_moved, self.disk = disk != self.disk, disk
            for name in list(self._nodes):
                if name not in states:
                    del self._nodes[name]  # deleted: its next beat takes the synchronous path (404)
                    self._written.pop(name, None)
                    self._acked_flush.pop(name, None)
            for name, (state, generation) in states.items():
                cached = self._nodes.get(name)
                if name in assignments:
                    self._nodes[name] = CachedNode.build(state, generation, *assignments[name], disk)
                elif cached is not None and (cached.state != state or disk_moved):
                    self._nodes[name] = CachedNode.build(state, generation, cached.assignment_json, cached.kv_flush,
                                                         disk)


def node_states(session: Any) -> dict[str, tuple[str, int]]:
    """Every node's (state, generation)."""
    rows = session.execute(select(NODES_TABLE.c.name, NODES_TABLE.c.state, NODES_TABLE.c.generation))
    return {row.name: (row.state, row.generation) for row in rows}


def is_transient(exc: BaseException) -> bool:
    """The database is unreachable, restarting or busy: the same write may succeed later."""
    return isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout))


def drop_reason(exc: BaseException) -> str:
    """A short, bounded label for why the store refused a row (the driver's error class)."""
    root = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    return type(root).__name__


def engines_key(req: HeartbeatRequest) -> str:
    """A node's engines without their metrics, as one string (a string: the garbage collector never scans it)."""
    return json.dumps([engine.model_dump(exclude={"metrics"}) for engine in req.engines], sort_keys=True, default=str)


def chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]

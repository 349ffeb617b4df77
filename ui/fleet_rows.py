"""The Fleet screen's rows: one per engine (with its node), plus one per node that has no engine, kept up to
date from the change stream, filtered and sorted. Pure Python over the stream's raw values (dicts), no
Textual: a delta that touches 4,000 engines costs a dict read and a small record per engine, and the
order is recomputed only when a row was added or removed, or the sort or filter values of a row moved.
A change of only an engine's figures (its metrics and rates, what the stream sends every second) marks the
row stale and rebuilds it when it is read, which is only when it is on screen: such a change moves no name,
state or filter match, and the sort column's figure is kept current at once.

    rows = FleetRows()
    changed = rows.update(fleet, applied)   # the keys whose cells changed (None: all of them)
    rows.order                              # the keys shown, in order
    rows.cells(key, fitted)                 # the cells of one row for the fitted columns

The `/` filter's terms are ui/fleet_filter.py's.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetctl.watch_state import Applied, FleetState
from ui import format as fmt
from ui.columns import Column, Fitted
from ui.fleet_filter import Term, parse_filter

# Display order. Priorities: what an 80-column terminal keeps (0, 1, then 2 as room allows).
COLUMNS: tuple[Column, ...] = (
    Column("node", "NODE", 8, 24, 0),
    Column("engine", "ENGINE", 8, 24, 0),
    Column("role", "ROLE", 7, None, 1),
    Column("class", "CLASS", 9, 24, 2),
    Column("state", "STATE", 9, None, 0),
    Column("drift", "DRIFT", 5, 30, 3),
    Column("queue", "RUN/WAIT", 8, None, 1, right=True),
    Column("kv", "KV", 9, 25, 1),
    Column("hit", "PREFIX", 6, None, 3, right=True),
    Column("ttft", "TTFT", 6, None, 2, right=True),
    Column("itl", "ITL", 6, None, 2, right=True),
    Column("restarts", "RESTARTS", 8, None, 4, right=True),
)
COLUMN_KEYS = tuple(c.key for c in COLUMNS)
# shift+letter sorts by a column (pressed again: reversed)
SORT_LETTERS = {"N": "node", "E": "engine", "R": "role", "C": "class", "S": "state", "Q": "queue", "K": "kv",
                "H": "hit", "T": "ttft", "I": "itl"}
FIELD_ATTRIBUTES = {"node": "node", "engine": "engine", "model": "model", "role": "role", "class": "class_ref",
                    "state": "state"}

# Row tones (the table colours them; ui/fleet.tcss): failed or node down, draining, starting, drifted, stopped.
ERROR, DRAINING, PENDING, DRIFTED, STOPPED, NORMAL = "error", "draining", "pending", "drifted", "stopped", ""
CORDONED = "⊘"  # after a cordoned node's name
CORDONED_STATE = "cordoned"  # a ready engine held out of traffic (engine cordon)

# An engine's stream fields that move only the figure columns; a patch of only these is the per-second case.
FIGURE_FIELDS = frozenset({"metrics", "rates", "updated_at"})
FIGURE_COLUMNS = frozenset({"queue", "kv", "hit", "ttft", "itl"})
NODE_ROW_FIELDS = frozenset({"state", "cordoned", "draining"})  # what a node's rows show of it (and name)
RATE_FIELDS = {"hit": "prefix_hit_rate", "ttft": "ttft_s", "itl": "itl_s"}  # column -> field of `rates`


_first = operator.itemgetter(0)


def natural(text: str) -> tuple[Any, ...]:
    """Sort key in which node-2 comes before node-10."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text.lower()))


@dataclass(slots=True)
class FleetRow:
    key: str  # the engine's key (node/name), or "node/" for a node without engines
    node: str
    engine: str  # "" for a node without engines
    model: str
    role: str
    class_ref: str
    state: str  # the engine's state; "node down" when its node is down, "draining" once marked, "cordoned"
    tone: str
    cordoned: bool
    drift: tuple[str, ...]  # fields that differ from the class revision
    running: float | None
    waiting: float | None
    kv: float | None
    hit: float | None
    ttft: float | None
    itl: float | None
    restarts: int | None
    names: tuple[Any, ...]  # natural sort key of (node, engine): the tie-break of every sort

    def field(self, name: str) -> str:
        return getattr(self, FIELD_ATTRIBUTES[name])

    def sort_value(self, column: str) -> Any:
        """The value sorted on (None: not known; sorted last)."""
        if column == "node":
            return self.names
        if column == "engine":
            return natural(self.engine)
        if column in ("role", "class", "state"):
            return self.field(column)
        if column == "drift":
            return len(self.drift)
        if column == "queue":
            return None if self.running is None and self.waiting is None else (self.running or 0) + (self.waiting or 0)
        return getattr(self, column)


def engine_row(key: str, raw: Mapping[str, Any], node: Mapping[str, Any] | None,
               names: tuple[Any, ...] | None = None) -> FleetRow:
    """`names`: the row's natural sort key when known already (an engine keeps its node and name)."""
    metrics = raw.get("metrics") or {}
    rates = raw.get("rates") or {}
    node_name = str(raw.get("node", ""))
    state = str(raw.get("state", ""))
    # an adopted engine (fleetctl did not launch it) runs on no agent's node: its own state says it all
    node_down = not raw.get("adopted") and (node is None or node.get("state") == "down")
    if node_down:
        state = "node down"
    elif raw.get("drain") and state in ("ready", "starting", "pending"):
        state = "draining"
    elif raw.get("cordoned") and state == "ready":
        state = CORDONED_STATE
    entries = raw.get("drift")
    drift = tuple(dict.fromkeys(str(d.get("field")) for d in entries)) if entries else ()
    return FleetRow(
        key=key, node=node_name, engine=str(raw.get("name", "")), model=str(raw.get("model", "")),
        role=str(raw.get("role", "")), class_ref=str(raw.get("class_ref", "")), state=state,
        tone=_tone(state, bool(drift), node), cordoned=bool(node and node.get("cordoned")), drift=drift,
        running=_number(metrics.get("num_requests_running")), waiting=_number(metrics.get("num_requests_waiting")),
        kv=_number(metrics.get("kv_cache_usage_perc")), hit=_number(rates.get(RATE_FIELDS["hit"])),
        ttft=_number(rates.get(RATE_FIELDS["ttft"])), itl=_number(rates.get(RATE_FIELDS["itl"])),
        restarts=_int(raw.get("restarts")),
        names=names or (natural(node_name), natural(str(raw.get("name", "")))),
    )


def refresh_figure(row: FleetRow, column: str, raw: Mapping[str, Any]) -> bool:
    """Set the figure(s) behind one figure column of `row` from the engine's stream value; whether its sort
    value changed. (Per engine and second on a fleet sorted by a figure: kept to plain reads and compares.)"""
    if column == "kv":
        value = _number((raw.get("metrics") or {}).get("kv_cache_usage_perc"))
        changed = value != row.kv
        row.kv = value
        return changed
    if column in RATE_FIELDS:
        value = _number((raw.get("rates") or {}).get(RATE_FIELDS[column]))
        changed = value != getattr(row, column)
        setattr(row, column, value)
        return changed
    before = row.sort_value("queue")
    metrics = raw.get("metrics") or {}
    row.running = _number(metrics.get("num_requests_running"))
    row.waiting = _number(metrics.get("num_requests_waiting"))
    return row.sort_value("queue") != before


def node_row(name: str, node: Mapping[str, Any]) -> FleetRow:
    """A node without engines: its own state in the STATE column."""
    state = "down" if node.get("state") == "down" else ("draining" if node.get("draining") else str(node.get("state", "")))
    return FleetRow(
        key=f"{name}/", node=name, engine="", model="", role="", class_ref="", state=state,
        tone=_tone(state, False, node), cordoned=bool(node.get("cordoned")), drift=(), running=None, waiting=None,
        kv=None, hit=None, ttft=None, itl=None, restarts=None, names=(natural(name), ()),
    )


def _tone(state: str, drifted: bool, node: Mapping[str, Any] | None) -> str:
    if state in ("failed", "node down", "down", "unreachable"):
        return ERROR
    if state in ("draining", CORDONED_STATE) or (node is not None and node.get("draining")):
        return DRAINING
    if state in ("pending", "starting"):
        return PENDING
    if drifted:
        return DRIFTED
    if state == "stopped":
        return STOPPED
    return NORMAL


def _number(value: Any) -> float | None:
    if value is None or type(value) is float:  # the common cases, first (this runs for every cell of a delta)
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


# --- the rows ---

class FleetRows:
    def __init__(self) -> None:
        self._rows: dict[str, FleetRow] = {}
        self._stale: set[str] = set()  # engine rows whose figures (but the sort column's) lag the stream
        self._engines: Mapping[str, Any] = {}  # the fleet's engines and nodes, to rebuild a stale row from
        self._nodes: Mapping[str, Any] = {}
        self._engines_of: dict[str, set[str]] = {}  # node -> keys of its engine rows
        self._name_order: list[str] | None = None  # every row's key by name; None: to sort again
        self.sort_column = "node"
        self.reverse = False
        self.filter_text = ""
        self._terms: tuple[Term, ...] = ()
        self.order: list[str] = []

    # --- reading rows ---

    @property
    def rows(self) -> dict[str, FleetRow]:
        """Every row, current (rebuilds the stale ones: for a whole-fleet reader, not the refresh path)."""
        self._refresh_stale()
        return self._rows

    def _refresh_stale(self) -> None:
        for key in list(self._stale):
            self.row(key)

    def row(self, key: str) -> FleetRow | None:
        """One row, current; None when there is no such row."""
        row = self._rows.get(key)
        if row is not None and key in self._stale:
            self._stale.discard(key)
            row = self._rows[key] = engine_row(key, self._engines[key], self._nodes.get(row.node), row.names)
        return row

    # --- sort and filter ---

    def set_sort(self, column: str, reverse: bool = False) -> None:
        if column != self.sort_column and column in FIGURE_COLUMNS:
            self._refresh_stale()  # a stale row's figures are current only in the old sort column
        self.sort_column, self.reverse = column, reverse
        self._reorder()

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip()
        self._terms = parse_filter(self.filter_text)
        self._reorder()

    def shown(self, row: FleetRow) -> bool:
        return all(term.matches(row) for term in self._terms)

    def _reorder(self) -> None:
        column = self.sort_column
        known: list[tuple[Any, str]] = []
        unknown: list[str] = []
        # Walked in name order, and the sort is stable (reversed too): ties stay in name order either way.
        value_of = operator.attrgetter(column) if column in FIGURE_COLUMNS and column != "queue" else (
            lambda row: row.sort_value(column))  # one attribute (the per-second case), else the general rule
        for row in self._in_name_order():
            if self._terms and not self.shown(row):
                continue
            value = value_of(row)
            if value is None:
                unknown.append(row.key)
            else:
                known.append((value, row.key))
        if column != "node":
            known.sort(key=_first, reverse=self.reverse)
        elif self.reverse:
            known.reverse()
        self.order = [key for _, key in known] + unknown

    def _in_name_order(self) -> list[FleetRow]:
        """Every row by (node, engine) name: kept until a row is added or removed."""
        if self._name_order is None:
            self._name_order = sorted(self._rows, key=lambda key: self._rows[key].names)
        rows = self._rows
        return [rows[key] for key in self._name_order]

    # --- following the fleet ---

    def update(self, fleet: FleetState, applied: Applied) -> set[str] | None:
        """Follow `applied`; the keys whose rows changed (None after a reset: every row)."""
        engines = self._engines = fleet.resources.get("engine", {})
        nodes = self._nodes = fleet.resources.get("node", {})
        if applied.reset:
            self._rebuild(engines, nodes)
            return None
        touched_nodes: set[str] = set()
        changed: set[str] = set()
        moved = False  # the order may have changed
        patched = applied.patched
        for kind, key in applied.changed:
            if kind == "engine":
                fields = patched.get((kind, key))
                if fields is not None and fields <= FIGURE_FIELDS and key in self._rows and key in engines:
                    moved |= self._figures_changed(key, engines[key])
                    changed.add(key)
                else:
                    moved |= self._put_engine(key, engines.get(key), nodes, changed, touched_nodes)
            elif kind == "node":
                fields = patched.get((kind, key))
                if fields is None or not fields.isdisjoint(NODE_ROW_FIELDS):
                    touched_nodes.add(key)
        for name in touched_nodes:
            moved |= self._refresh_node(name, engines, nodes.get(name), changed)
        if moved:
            self._reorder()
        return changed

    def _rebuild(self, engines: Mapping[str, Any], nodes: Mapping[str, Any]) -> None:
        self._rows.clear()
        self._stale.clear()
        self._name_order = None
        self._engines_of.clear()
        for key, raw in engines.items():
            row = engine_row(key, raw, nodes.get(str(raw.get("node", ""))))
            self._rows[key] = row
            self._engines_of.setdefault(row.node, set()).add(key)
        for name, node in nodes.items():
            if not self._engines_of.get(name):
                self._rows[f"{name}/"] = node_row(name, node)
        self._reorder()

    def _figures_changed(self, key: str, raw: Mapping[str, Any]) -> bool:
        """Only an engine's figures changed: mark its row stale, keep its sort figure current; whether the
        order may have moved."""
        self._stale.add(key)
        column = self.sort_column
        return column in FIGURE_COLUMNS and refresh_figure(self._rows[key], column, raw)

    def _put_engine(self, key: str, raw: Mapping[str, Any] | None, nodes: Mapping[str, Any], changed: set[str],
                    touched_nodes: set[str]) -> bool:
        """Follow one engine's change; whether the order may have moved."""
        changed.add(key)
        self._stale.discard(key)
        old = self._rows.get(key)
        node = None if raw is None else str(raw.get("node", ""))
        if old is not None and raw is not None and old.node == node:  # it stays on its node
            row = self._rows[key] = engine_row(key, raw, nodes.get(node), old.names)
            return self._moved(old, row)
        if old is not None:  # gone, or moved to another node
            del self._rows[key]
            self._name_order = None
            keys = self._engines_of.get(old.node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    touched_nodes.add(old.node)  # maybe a node-only row now
        if raw is None or node is None:
            return old is not None
        row = self._rows[key] = engine_row(key, raw, nodes.get(node))
        self._name_order = None
        self._engines_of.setdefault(node, set()).add(key)
        if self._rows.pop(f"{node}/", None) is not None:
            changed.add(f"{node}/")
        return True

    def _refresh_node(self, name: str, engines: Mapping[str, Any], node: Mapping[str, Any] | None,
                      changed: set[str]) -> bool:
        """A node changed (or lost its last engine): its engines' rows, or its own row."""
        moved = False
        keys = self._engines_of.get(name) or set()
        for key in keys:
            old = self._rows[key]
            row = engine_row(key, engines[key], node, old.names)
            self._rows[key] = row
            self._stale.discard(key)
            changed.add(key)
            moved |= self._moved(old, row)
        own_key = f"{name}/"
        old_own = self._rows.pop(own_key, None)
        if not keys and node is not None:
            row = node_row(name, node)
            self._rows[own_key] = row
            if old_own is None:
                self._name_order = None
            changed.add(own_key)
            return True if old_own is None else (moved or self._moved(old_own, row))
        if old_own is not None:
            self._name_order = None
            changed.add(own_key)
            return True
        return moved

    def _moved(self, old: FleetRow, new: FleetRow) -> bool:
        """Whether `new` may sit elsewhere in the order than `old` did (sort value or filter match moved)."""
        return (old.sort_value(self.sort_column) != new.sort_value(self.sort_column)
                or (bool(self._terms) and self.shown(old) != self.shown(new)))

    # --- reading ---

    def counts(self) -> tuple[int, int]:
        """(rows shown, rows in all)."""
        return len(self.order), len(self._rows)

    def cells(self, key: str, fitted: Sequence[Fitted]) -> tuple[list[str], str]:
        """The cells of row `key` for `fitted` columns, and its tone."""
        row = self.row(key)
        assert row is not None, key
        return [self._cell(row, f) for f in fitted], row.tone

    @staticmethod
    def _cell(row: FleetRow, fitted: Fitted) -> str:
        column = fitted.column.key
        if column == "node":
            return f"{row.node} {CORDONED}" if row.cordoned else row.node
        if column == "engine":
            return row.engine or fmt.NONE
        if column == "class":
            return row.class_ref
        if column in ("role", "state"):
            return row.field(column)
        if column == "drift":
            return ",".join(row.drift)
        if column == "queue":
            if row.running is None and row.waiting is None:
                return "" if not row.engine else fmt.NONE
            return f"{fmt.count(row.running or 0)}/{fmt.count(row.waiting or 0)}"
        if column == "kv":
            if row.kv is None:
                return "" if not row.engine else fmt.NONE
            return f"{fmt.bar(row.kv, fitted.width - 5)} {fmt.percent(row.kv):>4}"
        if column == "restarts":
            return "" if row.restarts is None else str(row.restarts)
        if column == "hit":
            return "" if not row.engine else fmt.percent(row.hit)
        value = getattr(row, column)
        return "" if not row.engine else fmt.seconds(value)

    def wanted_widths(self) -> dict[str, int]:
        """The widths the name columns' contents need (longest value, and the label)."""
        wanted = {"node": 4, "engine": 6, "class": 5, "drift": 5}
        for row in self._rows.values():  # names only: a stale row's are current
            wanted["node"] = max(wanted["node"], len(row.node) + (2 if row.cordoned else 0))
            wanted["engine"] = max(wanted["engine"], len(row.engine))
            wanted["class"] = max(wanted["class"], len(row.class_ref))
            wanted["drift"] = max(wanted["drift"], len(",".join(row.drift)))
        return wanted

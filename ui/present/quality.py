"""The Quality screen's content: the canary's verdicts as a grid (per model, a row named after the model for
its production stream, then a row per class revision; a column per batch condition, and `mixed` for the
production path: the model's row for every production probe, a revision's row for those it served), the
evidence of one stream, and the drills in effect.

A stream that has no verdict yet, or that the grid expects but the controller did not send, reads
"not measured": never blank, never green. A cell that no stream can fill (production has no batch
conditions; a revision that served no production probe has no `mixed`) is a dim dot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, tzinfo

from rich.text import Text

from fleetctl.canary.types import BATCH_CONDITIONS, condition_label
from fleetctl.controller.canary_responses import CanaryStreamView
from fleetctl.controller.responses import DrillView, FlagView
from ui.present.timefmt import NONE, clock_time, duration, seconds_until

PRODUCTION = "production"
MIXED = "mixed"
NOT_MEASURED = "not measured"
NOT_APPLICABLE = "·"
VERDICTS = {"healthy": ("✔ healthy", "green"), "drifting": ("◆ drifting", "bold dark_orange"),
            "failing": ("✖ failing", "bold orange_red1"), "not_measured": (NOT_MEASURED, "dim italic")}


@dataclass(frozen=True)
class GridRow:
    """One row: `cells` maps a column (b1, b4, ..., mixed) to the stream key there, None where the row
    expects a stream that was not sent, or is absent where no stream belongs."""

    key: str  # "model/class_ref" or "model/production"
    model: str
    revision: str  # the class revision, or "production"
    cells: dict[str, str | None]

    @property
    def label(self) -> str:
        """The model for its production row; a class revision, indented under it."""
        return self.model if self.revision == PRODUCTION else f"  {self.revision}"


def columns(streams: Iterable[CanaryStreamView]) -> list[str]:
    """b1, b4, b8, b16 (and any other condition a stream names, in order), then mixed."""
    conditions = set(BATCH_CONDITIONS) | {s.condition for s in streams if s.condition is not None}
    return [condition_label(c) for c in sorted(conditions)] + [MIXED]


def grid(streams: Mapping[str, CanaryStreamView]) -> tuple[list[str], list[GridRow]]:
    """The columns and rows of the grid: models in name order, each model's production row first, then its
    class revisions in order."""
    cols = columns(streams.values())
    pinned_cols = [c for c in cols if c != MIXED]
    by_row: dict[tuple[str, str], dict[str, str]] = {}
    for key, stream in streams.items():
        revision = stream.class_ref or PRODUCTION
        by_row.setdefault((stream.model, revision), {})[stream.batch] = key
    for model in {model for model, _ in by_row}:
        by_row.setdefault((model, PRODUCTION), {})  # every model has a production stream to show
    rows = []
    for (model, revision), found in sorted(by_row.items(), key=lambda item: _row_order(*item[0])):
        expected = [MIXED] if revision == PRODUCTION else pinned_cols + ([MIXED] if MIXED in found else [])
        cells: dict[str, str | None] = {col: found.get(col) for col in expected}
        rows.append(GridRow(f"{model}/{revision}", model, revision, cells))
    return cols, rows


def _row_order(model: str, revision: str) -> tuple[str, int, int, str]:
    if revision == PRODUCTION:
        return model, 0, 0, ""
    name, _, number = revision.rpartition("@r")
    return model, 1, int(number) if number.isdigit() else 0, name or revision


def verdict_text(stream: CanaryStreamView | None, narrow: bool = False) -> Text:
    """The cell of a stream: its verdict, or "not measured" when it has none (or was not sent); on two
    lines when `narrow`, so five columns of it fit 80 columns."""
    verdict = "not_measured" if stream is None else stream.verdict
    label, style = VERDICTS[verdict]
    return Text("not\nmeasured" if narrow and verdict == "not_measured" else label, style=style)


def cells(row: GridRow, cols: list[str], streams: Mapping[str, CanaryStreamView],
          narrow: bool = False) -> tuple[Text, ...]:
    out = [Text(row.label, style="bold" if row.revision == PRODUCTION else "")]
    for col in cols:
        if col not in row.cells:
            out.append(Text(NOT_APPLICABLE, style="dim"))
        else:
            key = row.cells[col]
            out.append(verdict_text(streams.get(key) if key else None, narrow))
    return tuple(out)


def stream_at(row: GridRow, column: str | None) -> str | None:
    """The stream key under the cursor: the cell's (None: a stream the row expects but was not sent), or
    the row's first stream when the cursor is on the model or revision column, or on a dot."""
    if column in row.cells:
        return row.cells[column]
    return next((key for key in row.cells.values() if key), None)


# --- the selected stream ---

def evidence(stream: CanaryStreamView | None, where: str, tz: tzinfo | None = None) -> Text:
    """What the tests say of a stream: verdict, since, blamed, statistic against threshold, bad of probes."""
    if stream is None:
        return Text(f"{where}: {NOT_MEASURED} (no probes scored for this stream yet)", style="dim")
    line = Text.assemble((f"{_stream_name(stream)}  ", "bold"), verdict_text(stream))
    if stream.since:
        line.append(f"  since {clock_time(stream.since, tz)}", style="dim")
    lines = [line]
    if stream.blamed:
        lines.append(Text(f"blamed: {stream.blamed}", style="bold orange_red1"))
    ev = stream.evidence
    if ev is None:
        lines.append(Text(f"{NOT_MEASURED}: no reference to judge this stream by", style="dim"))
        return Text("\n").join(lines)
    lines.append(_statistic("divergence", ev.statistic, ev.threshold))
    if ev.answer_statistic is not None and ev.answer_threshold is not None:
        lines.append(_statistic("answers", ev.answer_statistic, ev.answer_threshold))
    lines.append(Text(f"bad {ev.bad} of {ev.probes} probes" + _first_divergence(ev.first_divergence),
                      style="orange_red1" if ev.bad else ""))
    if ev.bad_prompts:
        worst = sorted(ev.bad_prompts.items(), key=lambda item: (-item[1], item[0]))[:5]
        lines.append(Text("worst prompts: " + ", ".join(f"{p} ({n})" for p, n in worst), style="dim"))
    if ev.served_by:
        served = sorted(ev.served_by.items(), key=lambda item: (-item[1], item[0]))[:5]
        lines.append(Text("bad answers served by: " + ", ".join(f"{who} ({n})" for who, n in served)))
    return Text("\n").join(lines)


def _stream_name(stream: CanaryStreamView) -> str:
    if stream.kind == "production":
        served = f" served by {stream.class_ref}" if stream.class_ref else ""
        return f"{stream.model} production{served} ({stream.batch})"
    return f"{stream.model} {stream.class_ref} {stream.batch}"


def _statistic(name: str, value: float, threshold: float) -> Text:
    over = value >= threshold
    return Text(f"{name} statistic {value:.3g} vs threshold {threshold:.3g}" + ("  (over)" if over else ""),
                style="orange_red1" if over else "")


def _first_divergence(position: int | None) -> str:
    return "" if position is None else f"; first divergence at token {position}"


# --- drills, and the plain "not measured" of a fleet without canary data ---

def drill_lines(drills: Iterable[DrillView], now: datetime) -> list[Text]:
    """The drills in effect, each with its time left (to its `ends_at`)."""
    lines = []
    for drill in sorted((d for d in drills if d.active), key=lambda d: d.id):
        remaining = seconds_until(drill.ends_at, now)
        lines.append(Text.assemble(("⚑ ", "bold magenta"), (drill.description, "magenta"),
                                   (f"  {duration(remaining)} left" if remaining is not None else "", "yellow")))
    return lines


def no_data(flags: Mapping[str, FlagView]) -> Text:
    probes = flags.get("canary_probes")
    why = ("canary probes are off (flag canary_probes=false)" if probes is not None and probes.value is False
           else "no canary streams yet: a golden set and a recorded reference are needed (docs/canary.md)")
    return Text.assemble((f"{NOT_MEASURED}: ", "bold"), why)


def summary(streams: Mapping[str, CanaryStreamView]) -> Text:
    """'12 streams: 10 healthy, 1 drifting, 1 not measured'."""
    counts: dict[str, int] = {}
    for stream in streams.values():
        counts[stream.verdict] = counts.get(stream.verdict, 0) + 1
    parts = [f"{counts[v]} {v.replace('_', ' ')}" for v in VERDICTS if counts.get(v)]
    return Text(f"{len(streams)} streams: " + (", ".join(parts) or NONE))

"""The pulse header at the top of every screen: the fleet at a glance, from PulseView and ControllerWatchView.

    ctl controller-0 (leader)  req/s 12.3  tok/s 4.5k  TTFT p50 120ms p90 340ms  ITL p90 25ms  rej/s 0
    prefix 62%  nodes 2/2  engines 4/4  unhealthy 0  drifted 0  table age 1.2s  frozen: no  flags: none

Pieces wrap as whole pieces to the width (two lines at 200 columns, more at 80). While the stream is cut
off the first piece says "STALE since HH:MM:SS" and why, and the header takes the CSS class `-stale`: every
figure is dimmed, never shown as live. Before the first snapshot it says it is connecting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual.widget import Widget

from fleetctl.controller.watch_contract import ControllerWatchView, PulseView
from ui import format as fmt

MAX_FLAGS_SHOWN = 2


@dataclass(frozen=True)
class Piece:
    label: str
    value: str
    tone: str = "value"  # value | alert | warn | stale


@dataclass(frozen=True)
class PulseState:
    """What the header shows (plain data; the app builds it)."""

    pulse: PulseView | None = None
    controller: ControllerWatchView | None = None
    stale_since: datetime | None = None
    error: str | None = None
    retry_in_s: float | None = None
    tz: tzinfo | None = None
    target: str = ""  # the controller's URL, while connecting
    extra: tuple[Piece, ...] = field(default_factory=tuple)


def pieces(state: PulseState) -> list[Piece]:
    """The header's pieces, in reading order."""
    head = _connection(state)
    pulse = state.pulse
    if pulse is None:
        return head
    return head + [
        Piece("req/s", fmt.rate(pulse.requests_s)),
        Piece("tok/s", fmt.rate(pulse.tokens_s)),
        _ttft(pulse),
        Piece("ITL", f"p90 {fmt.seconds(pulse.itl_p90_s)}"),
        Piece("rej/s", fmt.rate(pulse.rejections_s), "warn" if (pulse.rejections_s or 0) > 0 else "value"),
        Piece("prefix", fmt.percent(pulse.prefix_hit_rate)),
        Piece("nodes", f"{pulse.nodes_up}/{pulse.nodes}", "alert" if pulse.nodes_up < pulse.nodes else "value"),
        Piece("engines", f"{pulse.engines_ready}/{pulse.engines}"),
        Piece("unhealthy", str(pulse.engines_unhealthy), "alert" if pulse.engines_unhealthy else "value"),
        Piece("drifted", str(pulse.drifted), "warn" if pulse.drifted else "value"),
        Piece("table age", fmt.age(pulse.routing_table_age_s)),
        Piece("frozen:", "n/a" if pulse.frozen is None else ("YES" if pulse.frozen else "no"),
              "warn" if pulse.frozen else "value"),
        *([Piece("PINNED", " ".join(f"{model}->{ref}" for model, ref in sorted(pulse.pins.items())), "warn")]
          if pulse.pins else []),
        Piece("flags:", _flags(pulse.flags)),
        *state.extra,
    ]


def _ttft(pulse: PulseView) -> Piece:
    """The gateways' quantiles (streams); without streams in the window, the engines' mean of every request."""
    if pulse.ttft_p50_s is None and pulse.ttft_engines_s is not None:
        return Piece("TTFT", f"mean {fmt.seconds(pulse.ttft_engines_s)} (engines)")
    return Piece("TTFT", f"p50 {fmt.seconds(pulse.ttft_p50_s)} p90 {fmt.seconds(pulse.ttft_p90_s)}")


def _connection(state: PulseState) -> list[Piece]:
    if state.stale_since is not None:
        why = f" ({state.error})" if state.error else ""
        retry = f", retry in {fmt.age(state.retry_in_s)}" if state.retry_in_s is not None else ""
        return [Piece("STALE since", f"{fmt.clock_time(state.stale_since, state.tz)}{why}{retry}", "stale")]
    controller = state.controller
    if state.pulse is None and controller is None:
        return [Piece("connecting to", state.target or "the controller", "warn")]
    if controller is None:
        return []
    return [Piece("ctl", f"{controller.replica} ({'leader' if controller.leader else 'follower'})")]


def _flags(flags: dict[str, Any]) -> str:
    if not flags:
        return "none"
    shown = [f"{name}={_flag_value(value)}" for name, value in sorted(flags.items())[:MAX_FLAGS_SHOWN]]
    more = len(flags) - len(shown)
    return " ".join(shown) + (f" +{more}" if more else "")


def _flag_value(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def pack(items: list[Piece], width: int, separator: str = "  ") -> list[list[Piece]]:
    """Pieces in lines of at most `width` cells; a piece never splits (one longer than a line is cut)."""
    lines: list[list[Piece]] = [[]]
    used = 0
    for piece in items:
        size = cell_len(piece.label) + 1 + cell_len(piece.value)
        extra = size if not lines[-1] else size + len(separator)
        if lines[-1] and used + extra > width:
            lines.append([])
            used, extra = 0, size
        lines[-1].append(piece)
        used += extra
    return lines


class PulseHeader(Widget):
    COMPONENT_CLASSES: ClassVar[set[str]] = {"pulse--label", "pulse--value", "pulse--alert", "pulse--warn",
                                             "pulse--stale"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.state = PulseState()

    def show(self, state: PulseState) -> None:
        self.state = state
        self.set_class(state.stale_since is not None, "-stale")
        self.refresh(layout=True)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return len(pack(pieces(self.state), width))

    def render(self) -> Text:
        stale = self.state.stale_since is not None
        styles = {name: self.get_component_rich_style(f"pulse--{name}", partial=True)
                  for name in ("label", "value", "alert", "warn", "stale")}
        text = Text(no_wrap=True, overflow="ellipsis")
        for number, row in enumerate(pack(pieces(self.state), self.size.width)):
            if number:
                text.append("\n")
            for index, piece in enumerate(row):
                if index:
                    text.append("  ")
                if piece.tone == "stale":
                    label_style = value_style = styles["stale"]
                elif stale:  # dimmed by the widget's `-stale` class, never styled as live
                    label_style = value_style = Style()
                else:
                    label_style, value_style = styles["label"], styles[piece.tone]
                text.append(piece.label + " ", label_style)
                text.append(piece.value, value_style)
        return text

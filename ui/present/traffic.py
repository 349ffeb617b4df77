"""The Traffic screen's content: each model's weights over its class revisions (weight, share, ready
engines), a misroute drill in effect on top of them, and the gateways: what routing-table generation each
has applied against the controller's, how old its table is, live or stale."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rich.text import Text

from fleetctl.controller.contract import GatewayView
from fleetctl.controller.responses import TrafficView
from ui.present.timefmt import NONE, duration

REVISION_COLUMNS = ("MODEL", "REVISION", "WEIGHT", "SHARE", "READY", "SET BY")
GATEWAY_COLUMNS = ("GATEWAY", "URL", "TABLE AGE", "APPLIED", "STATE", "SEEN")
BAR = 8
EQUAL = "(equal)"  # no stored policy: every deployed revision weighted equally


def share_bar(share: float) -> Text:
    """'██████░░  75%' (to one decimal when it is not a whole percent: ' 0.5%')."""
    filled = round(max(0.0, min(1.0, share)) * BAR)
    percent = share * 100
    shown = f"{percent:3.0f}%" if abs(percent - round(percent)) < 0.05 else f"{percent:4.1f}%"
    return Text.assemble(("█" * filled, "dodger_blue1"), ("░" * (BAR - filled), "dim"), f" {shown:>5}")


def revision_rows(traffic: Mapping[str, TrafficView]) -> list[tuple[str, tuple[Text, ...]]]:
    """A row per (model, revision), keyed `model/ref`, models in name order, revisions as the API lists them."""
    rows = []
    for model in sorted(traffic):
        view = traffic[model]
        misrouted_to = view.drill.to_ref if view.drill is not None and view.drill.active else None
        for revision in view.revisions:
            ready = Text(str(revision.ready_engines),
                         style="orange_red1" if revision.weight > 0 and revision.ready_engines == 0 else "")
            set_by = (view.updated_by or NONE) if view.source == "policy" else EQUAL
            ref = Text(revision.ref)
            if revision.ref == misrouted_to:
                ref.append(" ⚑ drill", style="bold magenta")
            rows.append((f"{model}/{revision.ref}", (
                Text(model), ref, Text(f"{revision.weight:g}"), share_bar(revision.share), ready,
                Text(set_by, style="dim"))))
    return rows


def drill_lines(traffic: Mapping[str, TrafficView], left: Mapping[str, float | None]) -> list[Text]:
    """The misroute drills in effect, one line each (`left`: model -> seconds left): gateways route their
    fraction on top of the weights."""
    lines = []
    for model in sorted(traffic):
        drill = traffic[model].drill
        if drill is None or not drill.active:
            continue
        remaining = left.get(model)
        lines.append(Text.assemble(
            ("⚑ ", "bold magenta"), (drill.description, "magenta"),
            (f", {duration(remaining)} left" if remaining is not None else "", "yellow"),
            (f"  (fleetctl drill stop {drill.id})", "dim")))
    return lines


def applied_text(gateway: GatewayView, controller_generation: int | None) -> Text:
    """'42 = 42' (green) when the gateway is at the controller's generation or past it, '41 < 42' (yellow)
    while behind; just its own generation when the controller's is not known yet."""
    if controller_generation is None:
        return Text(str(gateway.generation))
    if gateway.generation >= controller_generation:
        return Text(f"{gateway.generation} = {controller_generation}", style="green")
    return Text(f"{gateway.generation} < {controller_generation}", style="yellow")


def gateway_rows(gateways: Mapping[str, GatewayView],
                 controller_generation: int | None) -> list[tuple[str, tuple[Text, ...]]]:
    rows = []
    for name in sorted(gateways):
        gateway = gateways[name]
        state = Text("stale", style="bold orange_red1") if gateway.stale else Text("live", style="green")
        rows.append((name, (
            Text(name), Text(gateway.url or NONE, style="dim"), Text(duration(gateway.table_age_s)),
            applied_text(gateway, None if gateway.stale else controller_generation), state,
            Text(f"{duration(gateway.seen_ago_s)} ago", style="dim"))))
    return rows


def gateway_summary(gateways: Iterable[GatewayView], controller_generation: int | None) -> Text:
    """'generation 42 applied by 1/2 live · 1 stale'."""
    views = list(gateways)
    if not views:
        return Text("none has reported", style="dim")
    live = [g for g in views if not g.stale]
    stale = f" · {len(views) - len(live)} stale" if len(live) < len(views) else ""
    if controller_generation is None:
        return Text(f"{len(live)} live{stale} · the controller's generation is not known yet", style="dim")
    applied = sum(1 for g in live if g.generation >= controller_generation)
    style = "green" if applied == len(live) else "yellow"
    return Text(f"generation {controller_generation} applied by {applied}/{len(live)} live{stale}", style=style)


def weighted_revisions(view: TrafficView) -> dict[str, float]:
    """The revisions offered in the weights modal, with their current weights (deployed ones at 0)."""
    return {revision.ref: revision.weight for revision in view.revisions}

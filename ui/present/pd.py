"""The P:D screen's content: per model its ratio, queues, the planner's mode and advice, a rebalance in
progress with its flips, and the planner's reasoning for the selected model."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text

from fleetctl.controller.pd_responses import PdModelView, RatioView, RecommendationView

MODEL_COLUMNS = ("MODEL", "CLASS", "RATIO", "P-QUEUE", "D-QUEUE", "MODE", "ADVICE", "REBALANCE")
ENGINE_COLUMNS = ("ENGINE", "NODE", "ROLE", "STATE", "RUNNING", "WAITING", "KV")
ROLE_STYLE = {"prefill": "dodger_blue1", "decode": "green3", "mixed": "grey70"}


def ratio_text(ratio: RatioView) -> Text:
    text = Text.assemble((f"{ratio.prefill}P", ROLE_STYLE["prefill"]), ":", (f"{ratio.decode}D", ROLE_STYLE["decode"]))
    if ratio.mixed:
        text.append(f" +{ratio.mixed}M", style=ROLE_STYLE["mixed"])
    return text


def advice(rec: RecommendationView | None) -> Text:
    if rec is None or not rec.measured:
        return Text("not measured", style="dim")
    if not rec.changes:
        return Text("hold", style="green3")
    text = Text.assemble("→ ", ratio_text(rec.recommended))
    if rec.blocked_by:
        text.append(f" (held: {rec.blocked_by})", style="yellow")
    return text


def queue(model: PdModelView, role: str) -> Text:
    waiting = sum(e.waiting for e in model.engines if e.role == role)
    return Text(str(waiting), style="orange_red1" if waiting > 0 else "")


def model_rows(models: Sequence[PdModelView]) -> list[tuple[str, tuple[Text, ...]]]:
    rows = []
    for m in sorted(models, key=lambda m: m.model):
        rebalance = m.rebalance
        # the counts first: on a narrow terminal the table cuts this last column short
        progress = Text("-", style="dim") if rebalance is None else Text(
            f"#{rebalance.id} {sum(f.phase == 'done' for f in rebalance.flips)}/{_flips_needed(m)} "
            f"→ {ratio_text(rebalance.target).plain} {rebalance.phase}", style="yellow")
        rows.append((m.model, (Text(m.model), Text(m.class_ref or "several", style="" if m.class_ref else "yellow"),
                               ratio_text(m.ratio), queue(m, "prefill"), queue(m, "decode"), Text(m.mode),
                               advice(m.recommendation), progress)))
    return rows


def _flips_needed(m: PdModelView) -> int:
    if m.rebalance is None:
        return 0
    done = sum(f.phase == "done" for f in m.rebalance.flips)
    target, now = m.rebalance.target, m.ratio
    return done + (abs(target.prefill - now.prefill) + abs(target.decode - now.decode) + abs(target.mixed - now.mixed)) // 2


def engine_rows(model: PdModelView | None) -> list[tuple[str, tuple[Text, ...]]]:
    if model is None:
        return []
    return [(e.name, (Text(e.name), Text(e.node), Text(e.role, style=ROLE_STYLE.get(e.role, "")),
                      Text(e.state + (" (draining)" if e.draining and e.state != "draining" else ""),
                           style="yellow" if e.draining else ""),
                      Text(str(e.running)), Text(str(e.waiting)), Text(f"{e.kv_cache_usage:.0%}")))
            for e in sorted(model.engines, key=lambda e: (e.role, e.name))]


def reasoning(model: PdModelView | None) -> Text:
    if model is None:
        return Text("no model selected", style="dim")
    rec = model.recommendation
    head = Text.assemble((f"{model.model}", "bold"), f"  mode {model.mode}, profile {model.profile.get('source')}")
    lines = [head]
    if rec is None:
        lines.append(Text("the planner has not run yet", style="dim"))
    else:
        lines += [Text(f"  {line}") for line in rec.reasons]
    if model.rebalance is not None:
        lines.append(Text(f"  rebalance #{model.rebalance.id}: {model.rebalance.message}", style="yellow"))
    return Text("\n").join(lines)

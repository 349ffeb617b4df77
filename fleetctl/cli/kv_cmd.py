"""`fleetctl kv status|flush`: the nodes' KV tiers (engine memory, then the agent's host DRAM, then local disk).

`status` reads what each node's agent reported on its last heartbeat (the node's `kv_tiers`) and, for the
offloads an engine dropped because its tier could not keep up, the engines' own counters. `flush` asks a
node's agent to drop the blocks of its tiers; the agent carries it out on its next heartbeat, and the command
waits until the agent says it did (unless --no-wait).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from enum import Enum
from typing import Annotated, Any

import typer

from fleetctl.cli.context import ReasonOption, YesOption, client, confirm
from fleetctl.cli.output import Column, Format, OutputOption, col, emit, status, to_plain
from fleetctl.controller.responses import NodeTierView
from fleetctl.errors import FleetError
from fleetctl.replica_class import parse_ref

NAME = "kv"
app = typer.Typer(no_args_is_help=True, help="KV tiers: each node's host-DRAM and disk tiers; flush them.")

MIB = 1 << 20


class Tier(str, Enum):
    dram = "dram"
    disk = "disk"


NodeArg = Annotated[str, typer.Argument(help="node name")]
TierOption = Annotated[Tier | None, typer.Option("--tier", help="one tier (dram or disk) [default: both]",
                                                 show_default=False)]
ClassOption = Annotated[str | None, typer.Option("--class", help="one replica class's tiers [default: every class's]",
                                                 show_default=False)]
NoWaitOption = Annotated[bool, typer.Option("--no-wait", help="return once the flush is recorded")]
TimeoutOption = Annotated[float, typer.Option("--timeout", help="seconds to wait for the agent to carry it out")]

TIER_COLUMNS = [
    col("NODE", "node"), col("CLASS", "class_name"), col("TIER", "tier"),
    Column("STATE", lambda r: "on" if r["enabled"] else "off"),
    Column("USED", lambda r: f"{r['used_bytes'] / MIB:.0f}/{r['capacity_bytes'] / MIB:.0f} MiB"),
    col("BLOCKS", "blocks"),
    Column("HIT%", lambda r: None if r["hit_rate"] is None else f"{100 * r['hit_rate']:.1f}"),
    Column("FETCH", lambda r: None if r["mean_fetch_s"] is None else f"{1000 * r['mean_fetch_s']:.2f}ms"),
    col("OFFLOADED", "offloaded"), col("DROPPED", "offload_dropped"), col("CORRUPT", "corrupt"),
]


def tier_rows(nodes: Iterable[dict[str, Any]], engines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per node, class and tier (the JSON form of NodeView and EngineView in, plain rows out), with the
    hit rate, the tier's mean read time per fetch, and the offloads the class's engines on the node dropped
    (an engine figure, the same on both tiers of a class)."""
    dropped: dict[tuple[str, str], float] = {}
    for engine in engines:
        key = (engine["node"], parse_ref(engine["class_ref"])[0])
        dropped[key] = dropped.get(key, 0) + (engine.get("metrics") or {}).get("kv_tier_offload_dropped", 0)
    rows = []
    for node in nodes:
        for tier in map(NodeTierView.model_validate, node.get("kv_tiers") or []):
            rows.append({"node": node["name"], "node_state": node["state"], **tier.model_dump(),
                         "hit_rate": tier.hit_rate, "mean_fetch_s": tier.mean_fetch_s,
                         "offload_dropped": int(dropped.get((node["name"], tier.class_name), 0))})
    return rows


@app.command("status")
def kv_status(ctx: typer.Context, node: Annotated[str | None, typer.Argument(help="one node [default: all]")] = None,
              output: OutputOption = Format.table) -> None:
    """Each node's KV tiers, per class and tier.

    On or off, size and use, blocks, hit rate, mean read time per fetch, blocks offloaded to the node,
    offloads dropped, corrupt blocks found. Counters are since the node's agent started."""
    api = client(ctx)
    nodes = [api.get_node(node)] if node else api.list_nodes()
    rows = tier_rows(to_plain(nodes), to_plain(api.list_engines(node=node)))
    if not rows and output is Format.table:
        status("no KV tiers reported" + (f" by node {node}" if node else "") +
               ": no class of the engines there asks for kv_tiers (fleetctl class show NAME)")
        return
    emit(rows, output, TIER_COLUMNS)
    down = sorted({row["node"] for row in rows if row["node_state"] != "up"})
    if down and output is Format.table:
        status(f"node(s) down, figures as last reported: {', '.join(down)}")


@app.command()
def flush(ctx: typer.Context, node: NodeArg, tier: TierOption = None, class_name: ClassOption = None,
          reason: ReasonOption = None, yes: YesOption = False, no_wait: NoWaitOption = False,
          timeout: TimeoutOption = 60.0) -> None:
    """Drop the blocks of NODE's KV tiers (audited).

    Engines keep serving; prompts that would have been fetched from the tier are computed again. The agent
    carries it out on its next heartbeat; this waits until it has, unless --no-wait."""
    what = f"{class_name or 'every class'}'s {tier.value if tier else 'DRAM and disk'} tier(s) on node {node}"
    confirm(f"Flush {what}?", yes)
    api = client(ctx)
    accepted = api.flush_node_kv(node, class_name, tier.value if tier else None, reason)
    status(f"node {node}: flush {accepted.flush.id} of {what} asked; its agent carries it out on its next heartbeat")
    if no_wait:
        return
    if api.get_node(node).state != "up":
        status(f"node {node} is down: the flush runs when its agent beats again")
        return
    done = wait_flushed(lambda: api.get_node(node), accepted.flush.id, timeout)
    blocks = sum((done.dropped or {}).values())
    per_class = ", ".join(f"{name} {count}" for name, count in sorted((done.dropped or {}).items()))
    status(f"node {node}: flushed, {blocks} block(s) dropped" + (f" ({per_class})" if per_class else ""))


def wait_flushed(fetch: Any, flush_id: int, timeout_s: float, poll_s: float = 0.5) -> Any:
    """Poll the node until its `kv_flushed` is flush `flush_id`; that. FleetError (flush_timeout) after
    `timeout_s`, or (flush_replaced) when another flush replaced it first."""
    deadline = time.monotonic() + timeout_s
    while True:
        node = fetch()
        if node.kv_flushed is not None and node.kv_flushed.id == flush_id:
            return node.kv_flushed
        if node.kv_flush is not None and node.kv_flush.id != flush_id:
            raise FleetError(f"node {node.name}: flush {flush_id} was replaced by flush {node.kv_flush.id}",
                             code="flush_replaced")
        if time.monotonic() >= deadline:
            raise FleetError(f"node {node.name}: flush {flush_id} not carried out after {timeout_s:g}s "
                             f"(node {node.state}; it stays asked for)", code="flush_timeout")
        time.sleep(poll_s)

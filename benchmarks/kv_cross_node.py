"""Cross-node KV fetch on a local fleet: what a block costs from another node's tier, from the engine's own node
tier, and to recompute, measured in one run; and whether the gateway's plan picks the cheaper one.

    .venv/bin/python benchmarks/kv_cross_node.py [--prompts 12] [--prompt-tokens 480]

A local fleet (`fleetctl up`, two nodes, SmolLM2) serving one class with `kv_tiers` and a small KV pool, one
engine per node (a and b). Closed loop, one request at a time, straight to the engines (greedy, 4 output tokens):
1. `cold`: each of --prompts random prompts computed by engine a (its answers are the reference);
2. fillers push them out of a's pool into node a's DRAM tier;
3. `peer`: each prompt sent to engine b with `kv_transfer_params.tier_peer` = engine a: b fetches the blocks
   from node a's tier through engine a, across nodes (loopback here);
4. `recompute`: as many fresh prompts of the same length on b, no peer (b computes them);
5. `own tier`: the first prompts again on engine a, which fetches them from its own node's tier.
Per mode: TTFT p50/mean, and answers equal to the cold ones. From the engines' counters: seconds per block
fetched from the peer (fleet_kv_tier_peer_fetch_seconds, by source node) and the link's bandwidth, seconds
per block from the own tier (fleet_kv_tier_fetch_seconds), and prefill seconds per computed block. Then, with
engine a cordoned, the gateway's `route explain` for one prompt: the cross-node plan for engine b, with the link
it now measured. Results: a table on stdout and benchmarks/results/kv_cross_node.json. Run it alone.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import log, metric_sum, percentile, print_table, scrape, wait, write_json  # noqa: E402
from benchmarks.rollout import measure_on_a_fleet  # noqa: E402
from fleetctl.client import ControllerClient  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "kv_cross_node.json"
BLOCK = 16
CLASS = "kvx-tiers"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--prompt-tokens", type=int, default=480)
    p.add_argument("--kv-cache-mib", type=int, default=24, help="each engine's own KV pool (small on purpose)")
    p.add_argument("--dram-mib", type=int, default=1024)
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args(argv)


def prompts(n: int, tokens: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1000, 40_000) for _ in range(tokens)] for _ in range(n)]


def complete(url: str, prompt: list[int], peer: tuple[str, str] | None = None) -> tuple[float, list[int]]:
    """(seconds to the first token, the greedy token ids) of one streamed request straight to an engine."""
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "stream": True,
                            "logprobs": 0, "return_tokens_as_token_ids": True}
    if peer is not None:
        body["kv_transfer_params"] = {"tier_peer": peer[0], "tier_peer_node": peer[1]}
    started, first, tokens = time.perf_counter(), None, []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for token in chunk["choices"][0].get("logprobs", {}).get("tokens", []):
                first = first if first is not None else time.perf_counter() - started
                tokens.append(int(token.removeprefix("token_id:")))
    return (first if first is not None else float("nan")), tokens


def mode_row(label: str, runs: list[tuple[float, list[int]]], reference: list[list[int]] | None) -> dict[str, Any]:
    ttfts = [t for t, _ in runs]
    same = None if reference is None else sum(1 for (_, got), want in zip(runs, reference) if got == want)
    return {"mode": label, "requests": len(runs), "ttft_p50_s": percentile(ttfts, 50),
            "ttft_mean_s": sum(ttfts) / len(ttfts), "same_answers": same}


def measure(args: argparse.Namespace, record: Any) -> dict[str, Any]:
    client = ControllerClient(record.controller_url, token=Path(record.token_file).read_text().strip())
    base = dict(client.get_class(record.class_ref).spec)
    spec = {**base, "kv_cache_mib": args.kv_cache_mib, "kv_tiers": {"dram_mib": args.dram_mib}}
    if args.model == "tiny":  # its blocks are so small that any pool in MiB holds every prompt: count blocks
        spec["engine_args"] = {**(base.get("engine_args") or {}), "num-blocks-override": 40}
    ref = client.apply_class(CLASS, spec).ref
    for deployment in client.list_deployments():
        client.delete_deployment(deployment.name, reason="kv cross-node benchmark")
    client.set_deployment("kvx", ref, 2, model=record.served_model, reason="kv cross-node benchmark")
    engines = wait(lambda: (lambda ready: ready if len({e.node for e in ready}) == 2 else None)(
        [e for e in client.list_engines() if e.class_ref == ref and e.state == "ready"]), 600, "an engine per node",
        every_s=1.0)
    a, b = sorted(engines, key=lambda e: e.node)[:2]
    log(f"engine a: {a.name} on {a.node}; engine b: {b.name} on {b.node}")
    work = prompts(args.prompts, args.prompt_tokens, seed=1)
    fresh = prompts(args.prompts, args.prompt_tokens, seed=2)
    fillers = prompts(8, args.prompt_tokens, seed=3)
    complete(a.url, fillers[0])  # warm-up of both engines' first-request costs
    complete(b.url, fillers[1])

    explained = prompts(1, args.prompt_tokens, seed=4)[0]  # for the gateway's plan: in node a's tier only
    cold = [complete(a.url, p) for p in work]
    complete(a.url, explained)
    for filler in fillers:
        complete(a.url, filler)
    need = (args.prompts + 1) * ((args.prompt_tokens - 1) // BLOCK)
    wait(lambda: metric_sum(scrape(a.url), "fleet_kv_tier_offloaded_blocks_total") >= need, 120,
         "engine a's blocks in node a's tier")
    peer = [complete(b.url, p, (a.url, a.node)) for p in work]
    recompute = [complete(b.url, p) for p in fresh]
    own = [complete(a.url, p) for p in work[: max(1, args.prompts // 2)]]
    reference = [tokens for _, tokens in cold]

    a_samples, b_samples = scrape(a.url), scrape(b.url)
    peer_blocks = metric_sum(b_samples, "fleet_kv_tier_peer_fetch_seconds_count", source=a.node)
    peer_s = metric_sum(b_samples, "fleet_kv_tier_peer_fetch_seconds_sum", source=a.node)
    own_blocks = metric_sum(a_samples, "fleet_kv_tier_fetch_seconds_count", tier="dram")
    own_s = metric_sum(a_samples, "fleet_kv_tier_fetch_seconds_sum", tier="dram")
    computed = metric_sum(b_samples, "vllm:prompt_tokens_by_source_total", source="local_compute") / BLOCK
    prefill_s = metric_sum(b_samples, "vllm:request_prefill_time_seconds_sum")
    block_bytes = _block_bytes(b_samples)
    report: dict[str, Any] = {
        "benchmark": "kv_cross_node", "command": "benchmarks/kv_cross_node.py " + " ".join(sys.argv[1:]),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": {"platform": platform.platform()},
        "modes": [mode_row("cold (a computes)", cold, None), mode_row("peer (b fetches from node a)", peer, reference),
                  mode_row("recompute (b computes)", recompute, None),
                  mode_row("own tier (a fetches from node a)", own, reference[: len(own)])],
        "peer_s_per_block": peer_s / peer_blocks if peer_blocks else None,
        "peer_failures": metric_sum(b_samples, "fleet_kv_tier_peer_fetch_failures_total", source=a.node),
        "own_tier_s_per_block": own_s / own_blocks if own_blocks else None,
        "prefill_s_per_block": prefill_s / computed if computed else None,
        "block_bytes": block_bytes,
        "link_mb_per_s": peer_blocks * block_bytes / peer_s / 1e6 if peer_s and block_bytes else None,
    }
    report["plan"] = gateway_plan(client, record, a, b, explained, measured=block_bytes is not None)
    return report


def _block_bytes(samples: Any) -> float | None:
    """The K/V bytes of one block, from vllm:cache_config_info's kv_cache_mib and num_gpu_blocks labels."""
    for labels, _ in samples.get("vllm:cache_config_info", []):
        mib, blocks = labels.get("kv_cache_mib"), labels.get("num_gpu_blocks")
        if mib not in (None, "", "None") and blocks not in (None, "", "None") and float(blocks) > 0:
            return float(mib) * 2**20 / float(blocks)
    return None


def gateway_plan(client: ControllerClient, record: Any, a: Any, b: Any, prompt: list[int], measured: bool
                 ) -> dict[str, Any] | None:
    """With engine a cordoned, the gateway's cross-node plan for engine b (on the link b measured, when the
    engines report their block size in bytes; the tiny model with a block-count pool does not)."""
    client.cordon_engine(a.name, reason="kv cross-node benchmark")
    last: dict[str, Any] = {}
    try:
        def plan() -> dict[str, Any] | None:
            body = {"model": record.served_model, "prompt": prompt, "max_tokens": 4}
            answer = last["explain"] = httpx.post(f"{record.gateway_url}/fleet/route/explain", json=body,
                                                  timeout=30).json()
            found = answer.get("cross_node")
            return found if found is not None and found["engine"] == b.name and found["measured"] == measured else None

        return wait(plan, 60, "the gateway's measured cross-node plan")
    except TimeoutError:
        log(f"no cross-node plan for {b.name}; the gateway's last explanation: {last.get('explain')}")
        return None
    finally:
        client.uncordon_engine(a.name, reason="kv cross-node benchmark")


def print_report(report: dict[str, Any]) -> None:
    print_table(report["modes"], [("mode", "mode", "s"), ("requests", "requests", "d"), ("TTFT p50 s", "ttft_p50_s", ".3f"),
                                  ("TTFT mean s", "ttft_mean_s", ".3f"), ("same answers", "same_answers", "")])
    for key in ("peer_s_per_block", "own_tier_s_per_block", "prefill_s_per_block", "link_mb_per_s", "peer_failures"):
        print(f"{key}: {report[key]}")
    plan = report.get("plan")
    print(f"gateway plan: {plan['reason'] if plan else None}")


def start_fleet(args: argparse.Namespace, state_dir: Path) -> Any:
    from fleetctl.localfleet import UpOptions, up

    options = UpOptions(state_dir=state_dir, nodes=2, model=args.model, controller_port=0, gateway_port=0,
                        engine_port_base=random.randrange(20_000, 40_000, 1_000), ready_timeout_s=600.0)
    return up(options, progress=log)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    report = measure_on_a_fleet(args, "fleet-kv-cross-node-bench-", measure, start=start_fleet)
    write_json(args.out, report)
    print_report(report)


if __name__ == "__main__":
    main()

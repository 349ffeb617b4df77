"""Reference-engine benchmarks. Every figure is a ratio against a baseline measured in the same run.

    .venv/bin/python benchmarks/engine.py [--only throughput,prefix,decode,stall,transfer,memory] [--quick]

Sections:
- throughput: 32 requests with lengths from the Azure 2023 conversation trace (prompt clip(ctx/8, 32, 512),
  output clip(gen/4, 16, 128), fixed seed): the engine vs HF `generate` one request at a time and vs one
  padded batch `generate` of the same 32.
- prefix: TTFT of a request whose first 1,024 tokens are cached vs the same request cold.
- decode: tokens/s at batch 1, 8, 32 as a fraction of the memory-bandwidth bound (weight bytes read per step
  / copy bandwidth measured in this run).
- stall: p99 inter-token latency of 8 streaming decodes while a 2,048-token prompt arrives, chunked prefill
  on vs off.
- transfer: a 1,024-token P/D handoff between two engine processes, GB/s vs a raw loopback socket transfer of
  the same bytes; TTFT through P/D vs a mixed engine.
- memory: RSS of an engine process with SmolLM2 and a 512 MiB KV pool.
Results go to stdout and benchmarks/results/engine.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agent.ports import free_port  # noqa: E402
from engine.reference.config import EngineConfig  # noqa: E402
from engine.reference.llm_engine import LLMEngine  # noqa: E402
from engine.contract.sampling_params import SamplingParams  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"
RESULTS = ROOT / "benchmarks" / "results" / "engine.json"
SEED = 0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


# --- workload -----------------------------------------------------------------------------------------


def trace_workload(n: int, seed: int = SEED) -> list[tuple[list[int], int]]:
    """n (prompt token ids, output length) pairs drawn from the Azure conversation trace, scaled down."""
    with open(TRACE) as f:
        rows = list(csv.DictReader(f))
    rng = random.Random(seed)
    picked = rng.sample(rows, n)
    workload = []
    for row in picked:
        prompt_len = min(512, max(32, int(row["ContextTokens"]) // 8))
        output_len = min(128, max(16, int(row["GeneratedTokens"]) // 4))
        workload.append((random_tokens(rng, prompt_len), output_len))
    return workload


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 49000) for _ in range(n)]


def make_engine(**overrides) -> LLMEngine:
    config = EngineConfig(model="smollm2", kv_cache_mib=overrides.pop("kv_cache_mib", 512), **overrides)
    return LLMEngine(config)


def run_to_completion(engine: LLMEngine, requests: list[tuple[list[int], int]], prefix: str = "r") -> dict:
    """Add every request at once and step until all finish. Returns per-request token timestamps."""
    stamps: dict[str, list[float]] = {}
    start = time.perf_counter()
    for i, (prompt, out_len) in enumerate(requests):
        engine.add_request(f"{prefix}{i}", prompt, SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True))
        stamps[f"{prefix}{i}"] = []
    while engine.has_work():
        for out in engine.step().outputs:
            stamps[out.request_id].extend([time.perf_counter()] * len(out.new_token_ids))
    return {"start": start, "end": time.perf_counter(), "stamps": stamps}


def hf_model(engine: LLMEngine):
    """HF's LlamaForCausalLM with the engine's own weights, so both sides compute the same model."""
    from transformers import LlamaForCausalLM

    from engine.reference.weights import load_model_bundle

    bundle = load_model_bundle(engine.config)
    model = LlamaForCausalLM(bundle.hparams.to_hf_config())
    model.load_state_dict(bundle.state_dict, strict=False)
    model.tie_weights()
    return model.eval()


# --- sections -----------------------------------------------------------------------------------------


def bench_throughput(quick: bool) -> dict:
    n = 8 if quick else 32
    workload = trace_workload(n)
    useful = sum(out for _, out in workload)
    engine = make_engine(max_num_seqs=64, max_num_batched_tokens=512)
    run_to_completion(engine, workload[:2], prefix="warm")
    timing = run_to_completion(engine, workload)
    engine_s = timing["end"] - timing["start"]
    model = hf_model(engine)
    seq_s = hf_sequential(model, workload)
    batch_s = hf_padded_batch(model, workload, engine.tokenizer.pad_token_id or 0)
    result = {
        "requests": n,
        "prompt_tokens": sum(len(p) for p, _ in workload),
        "generated_tokens": useful,
        "engine_tok_s": useful / engine_s,
        "hf_sequential_tok_s": useful / seq_s,
        "hf_padded_batch_tok_s": useful / batch_s,
    }
    result["vs_sequential"] = result["engine_tok_s"] / result["hf_sequential_tok_s"]
    result["vs_padded_batch"] = result["engine_tok_s"] / result["hf_padded_batch_tok_s"]
    return result


@torch.inference_mode()
def hf_sequential(model, workload) -> float:
    start = time.perf_counter()
    for prompt, out_len in workload:
        ids = torch.tensor([prompt])
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=out_len, min_new_tokens=out_len,
                       do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


@torch.inference_mode()
def hf_padded_batch(model, workload, pad_id: int) -> float:
    longest_prompt = max(len(p) for p, _ in workload)
    longest_output = max(out for _, out in workload)
    ids = torch.full((len(workload), longest_prompt), pad_id)
    mask = torch.zeros_like(ids)
    for row, (prompt, _) in enumerate(workload):  # left padding, as decoder-only batching needs
        ids[row, longest_prompt - len(prompt):] = torch.tensor(prompt)
        mask[row, longest_prompt - len(prompt):] = 1
    start = time.perf_counter()
    model.generate(ids, attention_mask=mask, max_new_tokens=longest_output, min_new_tokens=longest_output,
                   do_sample=False, pad_token_id=pad_id)
    return time.perf_counter() - start


def ttft(engine: LLMEngine, request_id: str, prompt: list[int]) -> float:
    start = time.perf_counter()
    engine.add_request(request_id, prompt, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    while engine.has_work():
        if any(out.request_id == request_id and out.new_token_ids for out in engine.step().outputs):
            elapsed = time.perf_counter() - start
            while engine.has_work():
                engine.step()
            return elapsed
    raise RuntimeError("request produced no token")


def bench_prefix(quick: bool) -> dict:
    rng = random.Random(SEED)
    engine = make_engine(max_model_len=4096, max_num_batched_tokens=2048)
    shared = random_tokens(rng, 1024)
    ttft(engine, "warmup", random_tokens(rng, 64))
    colds, warms = [], []
    for trial in range(2 if quick else 3):
        suffix = random_tokens(rng, 32)
        assert engine.reset_prefix_cache()
        colds.append(ttft(engine, f"cold{trial}", shared + suffix))
        warms.append(ttft(engine, f"warm{trial}", shared + random_tokens(rng, 32)))  # prefix cached by the cold run
    cold, warm = statistics.median(colds), statistics.median(warms)
    return {"cached_tokens": 1024, "ttft_cold_s": cold, "ttft_cached_s": warm, "speedup": cold / warm}


def copy_bandwidth_gbs() -> float:
    """Memory bandwidth by a large tensor copy (bytes read + bytes written), best of 5."""
    src = torch.ones(256 * 2**20 // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() * 4 / best / 1e9


def weight_bytes_per_step(model) -> int:
    """Bytes of weights a decode step reads: every layer's tensors, the final norm and the LM head (the
    embedding table, tied; only a few of its rows are read for the inputs, so it is counted once)."""
    tensors = [model.lm_head, model.norm]
    for layer in model.layers:
        tensors += [t for t in vars(layer).values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


def bench_decode(quick: bool) -> dict:
    engine = make_engine(max_num_seqs=64, max_num_batched_tokens=2048)
    weight_bytes = weight_bytes_per_step(engine.runner.model)
    bandwidth = copy_bandwidth_gbs()
    bound_steps_s = bandwidth * 1e9 / weight_bytes
    rng = random.Random(SEED)
    results = {"weight_bytes": weight_bytes, "copy_bandwidth_gbs": bandwidth, "batches": {}}
    for batch in (1, 8, 32):
        prompts = [(random_tokens(rng, 128), 24 if quick else 48) for _ in range(batch)]
        timing = run_to_completion(engine, prompts, prefix=f"b{batch}-")
        # steady decode: the gaps between tokens after the first
        gaps = [b - a for s in timing["stamps"].values() for a, b in zip(s[1:], s[2:])]
        step_s = statistics.median(gaps)
        tok_s = batch / step_s
        results["batches"][batch] = {
            "tok_s": tok_s,
            "bound_tok_s": batch * bound_steps_s,
            "fraction_of_bound": tok_s / (batch * bound_steps_s),
        }
    return results


def bench_stall(quick: bool) -> dict:
    out = {}
    for chunked in (True, False):
        engine = make_engine(max_model_len=4096, max_num_batched_tokens=512, enable_chunked_prefill=chunked)
        out["on" if chunked else "off"] = stall_p99(engine, quick)
    out["ratio_on_over_off"] = out["on"]["p99_itl_s"] / out["off"]["p99_itl_s"]
    return out


def stall_p99(engine: LLMEngine, quick: bool) -> dict:
    rng = random.Random(SEED)
    stamps: dict[str, list[float]] = {f"d{i}": [] for i in range(8)}
    for rid in stamps:
        engine.add_request(rid, random_tokens(rng, 64), SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
    long_added = long_done = None
    after_long = 0
    while engine.has_work() and after_long < 10:
        if long_added is None and all(len(s) >= 10 for s in stamps.values()):
            engine.add_request("long", random_tokens(rng, 2048), SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
            long_added = time.perf_counter()
        for out in engine.step().outputs:
            if out.request_id == "long":
                long_done = time.perf_counter()
            elif out.new_token_ids:
                stamps[out.request_id].append(time.perf_counter())
        if long_done is not None:
            after_long += 1
    for rid in stamps:
        engine.abort(rid)
    window = [b - a for s in stamps.values() for a, b in zip(s, s[1:]) if b >= long_added]
    return {"p99_itl_s": percentile(window, 99), "p50_itl_s": percentile(window, 50), "samples": len(window),
            "long_prompt_ttft_s": long_done - long_added}


def bench_memory(quick: bool) -> dict:
    import subprocess

    code = (
        "import psutil, sys; sys.path.insert(0, %r)\n"
        "from engine.reference.config import EngineConfig\n"
        "from engine.reference.llm_engine import LLMEngine\n"
        "from engine.contract.sampling_params import SamplingParams\n"
        "e = LLMEngine(EngineConfig(model='smollm2', kv_cache_mib=512))\n"
        "e.add_request('x', list(range(100, 300)), SamplingParams(max_tokens=8, temperature=0))\n"
        "while e.has_work(): e.step()\n"
        "print(psutil.Process().memory_info().rss)\n" % str(ROOT)
    )
    rss = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1])
    return {"kv_cache_mib": 512, "rss_mib": rss / 2**20}


# --- P/D transfer (engine processes on loopback) ----------------------------------------------------------


def start_engine(role: str, port: int, log_dir: Path):
    import subprocess

    import httpx

    argv = [sys.executable, "-m", "engine.reference", "--model", "smollm2", "--role", role, "--port", str(port),
            "--kv-cache-mib", "256", "--max-model-len", "2048", "--max-num-batched-tokens", "2048",
            "--engine-id", f"bench-{role}", "--log-level", "warning"]
    log_file = open(log_dir / f"engine-{role}.log", "w")
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{role} engine exited; see {log_file.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{role} engine did not become healthy")


def stream_ttft(client, url: str, body: dict) -> tuple[float, list[str]]:
    """Seconds to the first streamed token, and the streamed text pieces."""
    start, first, pieces = time.perf_counter(), None, []
    with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                first = first or time.perf_counter()
                pieces.append(chunk["choices"][0]["text"])
    return (first or time.perf_counter()) - start, pieces


def pd_handoff(client, prefill: str, decode: str, prompt: list[int], push: bool) -> dict:
    """vLLM's proxy protocol: prefill with do_remote_decode and max_tokens 1, then decode with its params."""
    params = {"do_remote_decode": True}
    if push:
        params["push_to"] = decode
    start = time.perf_counter()
    response = client.post(prefill + "/v1/completions", json={"model": "smollm2-135m", "prompt": prompt,
                           "max_tokens": 1, "temperature": 0, "kv_transfer_params": params}, timeout=300)
    response.raise_for_status()
    prefill_s = time.perf_counter() - start
    decode_ttft, pieces = stream_ttft(client, decode, {"model": "smollm2-135m", "prompt": prompt, "max_tokens": 8,
                                      "temperature": 0, "kv_transfer_params": response.json()["kv_transfer_params"]})
    return {"ttft_s": prefill_s + decode_ttft, "prefill_s": prefill_s, "text": "".join(pieces)}


def scrape_transfer(client, url: str) -> dict[str, float]:
    from engine.contract import parse_labels, sample_lines

    totals: dict[str, float] = {}
    for name, labels, value in sample_lines(client.get(url + "/metrics").text):
        if name in ("fleet_kv_transfer_bytes_sum", "fleet_kv_transfer_seconds_sum", "fleet_kv_transfer_bytes_count"):
            key = f"{name}:{parse_labels(labels).get('mode')}"
            totals[key] = totals.get(key, 0.0) + value
    return totals


def loopback_socket_gbs(nbytes: int) -> float:
    """Raw TCP over loopback: one sender thread, one receiver, the same number of bytes; best of 3."""
    import socket
    import threading

    payload = bytes(nbytes)
    best = float("inf")
    for _ in range(3):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        received = []

        def receive():
            conn, _ = server.accept()
            got = 0
            buffer = bytearray(1 << 20)
            while got < nbytes:
                n = conn.recv_into(buffer)
                if not n:
                    break
                got += n
            received.append(time.perf_counter())
            conn.close()

        thread = threading.Thread(target=receive)
        thread.start()
        sender = socket.create_connection(("127.0.0.1", port))
        start = time.perf_counter()
        sender.sendall(payload)
        thread.join()
        sender.close()
        server.close()
        best = min(best, received[0] - start)
    return nbytes / best / 1e9


def bench_transfer(quick: bool) -> dict:
    import tempfile

    import httpx

    log_dir = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    ports = {role: free_port() for role in ("prefill", "decode", "mixed")}
    procs = []
    try:
        for role, port in ports.items():
            procs.append(start_engine(role, port, log_dir))
        urls = {role: f"http://127.0.0.1:{port}" for role, port in ports.items()}
        rng = random.Random(SEED)
        client = httpx.Client()
        warm = random_tokens(rng, 64)
        pd_handoff(client, urls["prefill"], urls["decode"], warm, push=False)
        stream_ttft(client, urls["mixed"], {"model": "smollm2-135m", "prompt": warm, "max_tokens": 2, "temperature": 0})
        trials = 2 if quick else 3
        result: dict = {"prompt_tokens": 1024}
        for mode in ("pull", "push"):
            before = scrape_transfer(client, urls["decode"])
            runs = [pd_handoff(client, urls["prefill"], urls["decode"], random_tokens(rng, 1024), push=(mode == "push"))
                    for _ in range(trials)]
            after = scrape_transfer(client, urls["decode"])
            delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            nbytes = sum(v for k, v in delta.items() if k.startswith("fleet_kv_transfer_bytes_sum"))
            seconds = sum(v for k, v in delta.items() if k.startswith("fleet_kv_transfer_seconds_sum"))
            result[mode] = {"bytes_per_handoff": nbytes / trials, "transfer_s_per_handoff": seconds / trials,
                            "gbs": nbytes / seconds / 1e9 if seconds else None,
                            "ttft_s": statistics.median(r["ttft_s"] for r in runs),
                            "modes_seen": sorted({k.split(":")[1] for k in delta if delta[k]})}
        mixed = [stream_ttft(client, urls["mixed"], {"model": "smollm2-135m", "prompt": random_tokens(rng, 1024),
                                                     "max_tokens": 8, "temperature": 0})[0] for _ in range(trials)]
        result["mixed_ttft_s"] = statistics.median(mixed)
        result["loopback_socket_gbs"] = loopback_socket_gbs(int(result["pull"]["bytes_per_handoff"]))
        result["pull_vs_socket"] = (result["pull"]["gbs"] or 0) / result["loopback_socket_gbs"]
        result["pd_pull_ttft_over_mixed"] = result["pull"]["ttft_s"] / result["mixed_ttft_s"]
        result["pd_push_ttft_over_mixed"] = result["push"]["ttft_s"] / result["mixed_ttft_s"]
        return result
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except Exception:
                proc.kill()


SECTIONS = {
    "throughput": bench_throughput,
    "prefix": bench_prefix,
    "decode": bench_decode,
    "stall": bench_stall,
    "transfer": bench_transfer,
    "memory": bench_memory,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--quick", action="store_true", help="fewer requests and trials (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    for name in args.only.split(","):
        log(f"== {name}")
        results[name] = SECTIONS[name](args.quick)
        results[name]["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        print(json.dumps({name: results[name]}, indent=2), flush=True)
    results["machine"] = {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

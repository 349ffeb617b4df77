"""Command-line flags of the reference engine: one flag per EngineConfig field, mapping 1:1.

`build_parser()` and `config_from_args()` are shared by `python -m engine.reference` and `fleetctl engine
serve`; `add_engine_arguments(parser)` adds the flags to a parser someone else owns. A flag left out keeps
EngineConfig's default (argparse.SUPPRESS), so defaults live in one place: engine/reference/config.py.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, fields
from pathlib import Path
from typing import get_args

from engine.contract import REFERENCE_MODELS, Role
from engine.reference.config import EngineConfig, KVCacheDType, SamplerKind, TorchDType

API_KEY_ENV = "FLEET_ENGINE_API_KEY"
_BOOL = argparse.BooleanOptionalAction


def _flags() -> list[tuple[str, dict]]:
    """(EngineConfig field, add_argument kwargs), in the order `--help` shows them."""
    return [
        # model (correctness-relevant)
        ("model", dict(choices=REFERENCE_MODELS, help="smollm2 (SmolLM2-135M-Instruct) or tiny (seeded, for tests)")),
        ("served_model_name", dict(help="the model name clients ask for (default per model)")),
        ("dtype", dict(choices=get_args(TorchDType), help="weights and activations dtype")),
        ("kv_cache_dtype", dict(choices=get_args(KVCacheDType), help="KV cache dtype; auto = --dtype")),
        ("rope_scaling", dict(type=float, help="linear RoPE scaling factor")),
        ("sampler", dict(choices=get_args(SamplerKind), help="sampler implementation")),
        ("max_model_len", dict(type=int, help="context window in tokens (prompt + output)")),
        ("seed", dict(type=int, help="initialisation seed of the tiny model")),
        # KV cache and scheduling
        ("kv_cache_mib", dict(type=int, help="size of the paged KV pool, MiB")),
        ("num_blocks_override", dict(type=int, help="exact KV pool size in blocks, instead of --kv-cache-mib (tests)")),
        ("block_size", dict(type=int, help="tokens per KV block")),
        ("enable_prefix_caching", dict(action=_BOOL, help="reuse KV blocks of shared prompt prefixes")),
        ("enable_chunked_prefill", dict(action=_BOOL, help="split long prompts across steps")),
        ("max_num_seqs", dict(type=int, help="sequences in one batch")),
        ("max_num_batched_tokens", dict(type=int, help="tokens computed per step")),
        ("hash_seed", dict(help="prefix-hash seed (NONE_HASH); must match the gateway and peers")),
        # serving
        ("role", dict(choices=get_args(Role), help="mixed, prefill or decode (P/D)")),
        ("host", dict(help="address to bind; also the remote_host a prefill engine advertises")),
        ("port", dict(type=int, help="HTTP port")),
        ("engine_id", dict(help="remote_engine_id in P/D kv_transfer_params (default random)")),
        ("api_key", dict(help="require 'Authorization: Bearer KEY' on /v1/*, /kv/*, /drain and "
                              f"/reset_prefix_cache (or env {API_KEY_ENV})")),
        ("kv_events_endpoint", dict(help="ZMQ endpoint to bind the KV-event PUB socket, e.g. tcp://127.0.0.1:5557")),
        ("kv_events_replay_endpoint", dict(help="ZMQ endpoint to bind the KV-event replay ROUTER socket")),
        ("kv_events_topic", dict(help="topic frame of KV-event messages")),
        ("kv_load_failure_policy", dict(choices=("recompute", "fail"),
                                        help="decode side: what a failed K/V transfer does")),
        ("kv_transfer_timeout_s", dict(type=float, help="P/D: pull timeout, and how long held/pushed blocks live")),
        ("kv_side_channel_port", dict(type=int, help="P/D: TCP port for K/V pulls on --host, advertised as "
                                                     "remote_kv_port; 0 = an ephemeral port, -1 = off (HTTP only)")),
        ("drain_grace_s", dict(type=float, help="on SIGTERM or POST /drain: how long in-flight requests may finish")),
        ("keepalive_interval_s", dict(type=float, help="SSE keep-alive comment interval while a stream waits")),
        ("num_threads", dict(type=int, help="torch intra-op threads (default: torch's)")),
        ("cache_dir", dict(type=Path, help="where weights and the tokenizer are cached (env FLEET_CACHE_DIR)")),
    ]


def add_engine_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    defaults = {f.name: f.default for f in fields(EngineConfig) if f.default is not MISSING}
    for name, kwargs in _flags():
        if defaults.get(name) is not None:
            kwargs = {**kwargs, "help": f"{kwargs['help']} (default: {defaults[name]})"}
        parser.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS, **kwargs)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.reference", description="Run the fleetctl reference engine (OpenAI-compatible API)."
    )
    add_engine_arguments(parser)
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return parser


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """EngineConfig from parsed flags; unset flags keep EngineConfig's defaults."""
    names = {f.name for f in fields(EngineConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    if "api_key" not in values and os.environ.get(API_KEY_ENV):
        values["api_key"] = os.environ[API_KEY_ENV]
    return EngineConfig(**values)


def config_fields_without_flag() -> set[str]:
    """EngineConfig fields no flag sets (a test keeps this empty)."""
    return {f.name for f in fields(EngineConfig)} - {name for name, _ in _flags()}

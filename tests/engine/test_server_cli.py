"""The engine's flags map 1:1 onto EngineConfig fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.reference.cli_args import API_KEY_ENV, build_parser, config_fields_without_flag, config_from_args
from engine.reference.config import EngineConfig


def parse(*argv: str) -> EngineConfig:
    return config_from_args(build_parser().parse_args(list(argv)))


def test_every_config_field_has_a_flag() -> None:
    assert config_fields_without_flag() == set()


def test_unset_flags_keep_the_config_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    config, default = parse(), EngineConfig()
    for name in EngineConfig.model_fields:
        if name != "engine_id":  # random per instance
            assert getattr(config, name) == getattr(default, name), name


def test_flags_set_their_fields() -> None:
    config = parse(
        "--model", "smollm2", "--served-model-name", "s", "--role", "decode", "--host", "0.0.0.0", "--port", "9001",
        "--kv-cache-mib", "64", "--num-blocks-override", "100", "--block-size", "32", "--max-model-len", "4096",
        "--max-num-seqs", "8", "--max-num-batched-tokens", "256", "--dtype", "bfloat16", "--kv-cache-dtype", "float16",
        "--rope-scaling", "2.0",
        "--sampler", "approximate_topk", "--no-enable-prefix-caching", "--no-enable-chunked-prefill",
        "--kv-events-endpoint", "tcp://127.0.0.1:5557", "--kv-events-replay-endpoint", "tcp://127.0.0.1:5558",
        "--kv-events-topic", "t", "--engine-id", "e1", "--hash-seed", "42", "--api-key", "k",
        "--kv-load-failure-policy", "fail", "--kv-transfer-timeout-s", "3.5", "--drain-grace-s", "7",
        "--keepalive-interval-s", "2", "--num-threads", "2", "--seed", "5", "--cache-dir", "/tmp/x",
    )
    assert config == EngineConfig(
        model="smollm2", served_model_name="s", role="decode", host="0.0.0.0", port=9001, kv_cache_mib=64,
        num_blocks_override=100, block_size=32, max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=256,
        dtype="bfloat16",
        kv_cache_dtype="float16", rope_scaling=2.0, sampler="approximate_topk", enable_prefix_caching=False,
        enable_chunked_prefill=False, kv_events_endpoint="tcp://127.0.0.1:5557",
        kv_events_replay_endpoint="tcp://127.0.0.1:5558", kv_events_topic="t", engine_id="e1", hash_seed="42",
        api_key="k", kv_load_failure_policy="fail", kv_transfer_timeout_s=3.5, drain_grace_s=7.0,
        keepalive_interval_s=2.0, num_threads=2, seed=5, cache_dir=Path("/tmp/x"),
    )


def test_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert parse().api_key == "from-env"
    assert parse("--api-key", "from-flag").api_key == "from-flag"


def test_bad_choices_are_refused() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--role", "wizard"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model", "gpt-5"])

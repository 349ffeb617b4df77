"""A replica class's kv_tiers rendered for vLLM: the same fields mean the same tiers on both backends. There is
no GPU here: the rendered `--kv-transfer-config` is the contract."""

from __future__ import annotations

import json

from engine.vllm.command import vllm_layout
from tests.vllm.test_render import flag, render, spec


def transfer(launch) -> dict:
    return json.loads(flag(launch.argv, "--kv-transfer-config"))


def test_a_class_without_tiers_renders_no_connector_on_a_mixed_engine():
    assert "--kv-transfer-config" not in render(spec()).argv
    assert "--kv-transfer-config" not in render(spec(kv_tiers={"dram_mib": 0})).argv


def test_dram_only_is_vllms_native_cpu_offloading_sized_in_bytes_over_all_workers():
    config = transfer(render(spec(kv_tiers={"dram_mib": 2048}, tensor_parallel_size=2)))
    assert config == {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {"cpu_bytes_to_use": 2048 * 2**20,
                                                    "self_describing_kv_events": True}}


def test_a_disk_tier_is_lmcache_with_per_worker_gigabytes_and_a_directory_per_layout():
    class_spec = spec(kv_tiers={"dram_mib": 4096, "disk_mib": 16384, "disk_path": "/nvme/kv"}, tensor_parallel_size=2)
    config = transfer(render(class_spec))
    assert config["kv_connector"] == "LMCacheConnectorV1" and config["kv_role"] == "kv_both"
    extra = config["kv_connector_extra_config"]
    assert extra["lmcache.local_cpu"] is True
    assert extra["lmcache.max_local_cpu_size"] == 2.0  # 4 GiB over 2 ranks
    assert extra["lmcache.max_local_disk_size"] == 8.0
    assert extra["lmcache.local_disk"] == f"file:///nvme/kv/{vllm_layout(class_spec)}/"


def test_the_disk_directory_differs_between_classes_whose_kv_differs():
    a = spec(kv_tiers={"dram_mib": 1024, "disk_mib": 1024})
    b = spec(kv_tiers={"dram_mib": 1024, "disk_mib": 1024}, kv_cache_dtype="fp8")
    c = spec(kv_tiers={"dram_mib": 1024, "disk_mib": 1024}, max_num_seqs=7)  # performance only: the same KV
    assert vllm_layout(a) != vllm_layout(b) and vllm_layout(a) == vllm_layout(c)
    disk = [transfer(render(s))["kv_connector_extra_config"]["lmcache.local_disk"] for s in (a, b)]
    assert disk[0] != disk[1] and all(d.startswith("file:///var/lib/fleetctl/kv-tier/") for d in disk)


def test_the_disk_tier_switched_off_renders_dram_only():
    launch = render(spec(kv_tiers={"dram_mib": 1024, "disk_mib": 8192}), kv_tier_disk_enabled=False)
    assert transfer(launch)["kv_connector"] == "OffloadingConnector"


def test_pd_engines_get_nixl_first_and_the_tiers_beside_it():
    launch = render(spec(kv_tiers={"dram_mib": 1024}), role="decode", side_channel_port=8103)
    config = transfer(launch)
    assert config["kv_connector"] == "MultiConnector"
    first, second = config["kv_connector_extra_config"]["connectors"]
    assert first == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert second["kv_connector"] == "OffloadingConnector"
    assert launch.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "8103"

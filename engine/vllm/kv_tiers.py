"""A replica class's `kv_tiers` as vLLM's KV connector configuration, so the fields mean on a GPU node what
they mean on the reference engine: `dram_mib` of host DRAM behind the engine's KV memory, then `disk_mib` of
local disk under `disk_path`.

| kv_tiers                      | vLLM (`--kv-transfer-config`)                                                  |
|-------------------------------|--------------------------------------------------------------------------------|
| dram_mib only                 | vLLM's native CPU offloading: `OffloadingConnector`, `cpu_bytes_to_use` = dram_mib MiB in bytes (vLLM counts it over all workers, as our field does) |
| dram_mib and disk_mib         | LMCache (`LMCacheConnectorV1`): `lmcache.local_cpu`, `lmcache.max_local_cpu_size` and `lmcache.local_disk`, `lmcache.max_local_disk_size`, in GB **per worker** (LMCache's unit), so the class's totals are divided by TP x PP |
| role prefill or decode        | the above beside NIXL in a `MultiConnector` (NIXL first: a decode engine loads the prefill's K/V before it looks in its tiers) |
| disk tier switched off (flag) | rendered without the disk tier: vLLM reads its connector config at start, so the flag takes effect at the engine's next start |

The disk directory gets a subdirectory named by the class's KV layout digest: LMCache's keys do not include a
weights fingerprint (nor do vLLM's offloading hashes), so two revisions sharing a directory could load each
other's K/V; one directory per layout cannot.

Not rendered: vLLM's offloading emits `CPU` KV events only with `self_describing_kv_events` (set here) and
LMCache emits none for its tiers (LMCache issue 3532), so with a disk tier on vLLM the gateway sees GPU events
only and routes by engine memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

MIB = 1 << 20
GB_PER_MIB = 1 / 1024  # LMCache sizes are GB (2**30 bytes)
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}


def tier_sizes(kv_tiers: Mapping[str, Any] | None, *, disk_enabled: bool = True) -> tuple[int, int]:
    """(dram_mib, disk_mib) the engine should get: 0 for a tier the class does not ask for, or switched off."""
    if not kv_tiers:
        return 0, 0
    dram = int(kv_tiers.get("dram_mib") or 0)
    disk = int(kv_tiers.get("disk_mib") or 0) if disk_enabled else 0
    return dram, disk


def tier_connector(kv_tiers: Mapping[str, Any] | None, *, layout: str, default_disk_path: str, world_size: int = 1,
                   disk_enabled: bool = True) -> dict[str, Any] | None:
    """The KV connector that gives a vLLM engine the class's tiers; None when the class asks for none."""
    dram_mib, disk_mib = tier_sizes(kv_tiers, disk_enabled=disk_enabled)
    if dram_mib <= 0 and disk_mib <= 0:
        return None
    if disk_mib <= 0:
        return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"cpu_bytes_to_use": dram_mib * MIB, "self_describing_kv_events": True}}
    ranks = max(1, world_size)
    root = PurePosixPath((kv_tiers or {}).get("disk_path") or default_disk_path) / layout
    return {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "lmcache.local_cpu": dram_mib > 0,
                "lmcache.max_local_cpu_size": round(dram_mib * GB_PER_MIB / ranks, 6),
                "lmcache.local_disk": f"file://{root}/",
                "lmcache.max_local_disk_size": round(disk_mib * GB_PER_MIB / ranks, 6)}}


def transfer_config(role: str, tiers: dict[str, Any] | None) -> dict[str, Any] | None:
    """`--kv-transfer-config` for an engine of `role` with the tier connector `tiers` (or None)."""
    if role == "mixed":
        return tiers
    if tiers is None:
        return dict(NIXL)
    return {"kv_connector": "MultiConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": [dict(NIXL), tiers]}}

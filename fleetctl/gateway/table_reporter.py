"""Tell the controller which routing-table generation this gateway applied (`POST /api/v1/gateways/report`).

`fleetctl traffic set` waits until every live gateway reports the generation that includes the change.
Call `report_applied` after every refresh of the table (at least once per refresh interval, whether or not
the table changed): the controller marks a gateway `stale` (not waited for) after 3 refresh intervals
without a report. The report also carries `served`, this gateway's cumulative per-revision counters
(served.ServedRecorder.snapshot), which a rollout's analysis measures its windows on, and `hash_mismatch`,
the engines whose KV events hash prefixes with another seed (hash_check.py), which `fleetctl status` shows. A failed report is
logged and returned as False, never raised: nothing on the request path waits for the controller.

    await report_applied(client, "gw-a", "http://10.0.0.5:8000", cache.table.generation, cache.age_s() or 0.0,
                         refresh_interval_s=settings.table_refresh_s, served=service.served.snapshot())
"""

from __future__ import annotations

import logging
from typing import Any

from fleetctl.client import AsyncControllerClient
from fleetctl.errors import FleetError

log = logging.getLogger(__name__)


async def report_applied(client: AsyncControllerClient, name: str, url: str | None, generation: int,
                         table_age_s: float, refresh_interval_s: float | None = None,
                         served: dict[str, dict[str, Any]] | None = None,
                         hash_mismatch: list[str] | None = None) -> bool:
    """True when the controller took the report."""
    payload: dict[str, Any] = {"name": name, "url": url, "generation": generation, "table_age_s": max(table_age_s, 0.0)}
    if refresh_interval_s is not None:
        payload["refresh_interval_s"] = refresh_interval_s
    if served is not None:
        payload["served"] = served
    if hash_mismatch is not None:
        payload["hash_mismatch"] = hash_mismatch
    try:
        await client.report_gateway(payload)
    except FleetError as exc:
        log.warning("could not report routing generation %d to the controller: %s", generation, exc)
        return False
    return True

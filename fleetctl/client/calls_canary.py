"""The call table: the quality canary: streams and verdicts, drills, golden sets and references."""

from __future__ import annotations

from typing import Any

from fleetctl.client.endpoint import Request, endpoint, params_of
from fleetctl.controller.canary_ref_responses import GoldenSetStored, GoldenSetSummary, ReferenceSummary
from fleetctl.controller.canary_responses import CanaryClassView, CanaryEventView, CanaryStreamView
from fleetctl.controller.responses import DrillStarted, DrillStopResult, DrillView


class CanaryCalls:
    """The quality canary: streams and verdicts, drills, golden sets and references."""

    # the quality canary
    @endpoint("GET", "/api/v1/canary/status", list[CanaryStreamView])
    def canary_status(model: str | None = None) -> Request:
        """Each canary stream's verdict and evidence (of `model`)."""
        return Request(params=params_of(model=model))

    @endpoint("GET", "/api/v1/canary/classes/{ref}", CanaryClassView)
    def canary_class(ref: str, limit: int | None = None) -> Request:
        """A class revision's streams and the latest `limit` probes it served."""
        return Request(path={"ref": ref}, params=params_of(limit=limit))

    @endpoint("GET", "/api/v1/canary/events", list[CanaryEventView])
    def canary_events(model: str | None = None, limit: int | None = None) -> Request:
        """Verdict changes (alerts, recoveries), oldest first."""
        return Request(params=params_of(model=model, limit=limit))

    # canary drills
    @endpoint("POST", "/api/v1/drills/misroute", DrillStarted)
    def start_misroute_drill(model: str, to: str, fraction: float, duration_s: float | None = None,
                             reason: str | None = None) -> Request:
        """Send `fraction` (0 < f <= 0.5) of `model`'s traffic to the revision `to` for `duration_s` (default
        20 minutes, at most 4 hours); a Conflict (`drill_in_progress`) when the model has a drill in effect."""
        return Request(json={"model": model, "to": to, "fraction": fraction, "duration_s": duration_s}, reason=reason)

    @endpoint("POST", "/api/v1/drills/plant", DrillStarted)
    def start_plant_drill(engine: str, fault: str, duration_s: float | None = None,
                          reason: str | None = None) -> Request:
        """Restart the running `engine` with the hidden `fault` (engine.contract.faults) for `duration_s`."""
        return Request(json={"engine": engine, "fault": fault, "duration_s": duration_s}, reason=reason)

    @endpoint("GET", "/api/v1/drills", list[DrillView])
    def list_drills() -> Request:
        """The drills in effect (oldest first), then the last 50 that ended (newest first)."""
        return Request()

    @endpoint("POST", "/api/v1/drills/{drill_id}/stop", DrillStopResult)
    def stop_drill(drill_id: int, reason: str | None = None) -> Request:
        return Request(path={"drill_id": str(drill_id)}, reason=reason)

    @endpoint("POST", "/api/v1/drills/stop", DrillStopResult)
    def stop_all_drills(reason: str | None = None) -> Request:
        """End every drill in effect."""
        return Request(reason=reason)

    # the quality canary: golden sets and references
    @endpoint("POST", "/api/v1/canary/golden-sets", GoldenSetStored)
    def put_golden_set(golden_set: dict[str, Any], reason: str | None = None) -> Request:
        """Store a golden set (as its file holds it); `result` is "unchanged" for the identical set. A bad set
        is a ValidationFailed naming the entry; other content under a stored version a Conflict naming `version`."""
        return Request(json={"golden_set": golden_set}, reason=reason)

    @endpoint("GET", "/api/v1/canary/golden-sets", list[GoldenSetSummary])
    def list_golden_sets() -> Request:
        return Request()

    @endpoint("POST", "/api/v1/canary/references", ReferenceSummary)
    def put_reference(reference: dict[str, Any], reason: str | None = None) -> Request:
        """Store a recorded reference (canary.types.Reference as JSON); its golden set must be stored first."""
        return Request(json={"reference": reference}, reason=reason)

    @endpoint("GET", "/api/v1/canary/references", list[ReferenceSummary])
    def list_references(model: str | None = None) -> Request:
        """Oldest first; summaries (prompts, noise per batch condition, expected answers), not the bodies."""
        return Request(params=params_of(model=model))

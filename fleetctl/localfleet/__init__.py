"""A local fleet on loopback (`fleetctl up` / `fleetctl down`): `fleet` orchestrates, `processes` starts
and stops the processes. The local fleet is glue that runs agents, so unlike the rest of fleetctl it uses the
`agent` package's client, port probe and engine records."""

from fleetctl.localfleet.fleet import FleetRecord, LocalFleetError, UpOptions, down, up

__all__ = ["FleetRecord", "LocalFleetError", "UpOptions", "down", "up"]

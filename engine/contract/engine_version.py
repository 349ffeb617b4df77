"""The reference engine's own version: the version of the distribution that ships it (fleetctl's package).

A replica class may pin it (`engine_version`); the agent refuses to launch a reference engine of another
version, because a different engine build may give different tokens.
"""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "fleetctl"
UNKNOWN = "unknown"  # run from a source tree that was never installed


def reference_engine_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN

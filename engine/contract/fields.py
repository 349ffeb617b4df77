"""The string fields that name an engine and where it listens, each bounded by the column that stores it.

The widths equal the controller's columns (fleetctl/controller/models/; a test keeps them equal), so a
value that validates here can always be stored there.
"""

from __future__ import annotations

from engine.contract.bounds import bounded_text

ENGINE_NAME_MAX = 75  # <deployment>-<index>: a 63-character name plus a suffix
MODEL_NAME_MAX = 200
CLASS_REF_MAX = 80  # NAME@rN
ENDPOINT_MAX = 500
LAST_EXIT_MAX = 2000

EngineName = bounded_text(ENGINE_NAME_MAX, non_blank=True)
ModelName = bounded_text(MODEL_NAME_MAX, non_blank=True)
ClassRef = bounded_text(CLASS_REF_MAX, non_blank=True)
Endpoint = bounded_text(ENDPOINT_MAX)
ExitText = bounded_text(LAST_EXIT_MAX)

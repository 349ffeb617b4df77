"""The per-node agent: supervises engines, reports to the controller, serves a local break-glass API."""

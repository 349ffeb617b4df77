"""The controller: the fleet's desired state (replica classes, deployments, traffic, flags) in a SQL store,
the observed state agents report, the reconciler that plans each node's assignment, auth and audit,
served as a JSON API under /api/v1.

Layers: `api/` (FastAPI routes) -> services (`classes`, `deployments`, `nodes`, `tokens`, `traffic`, `views`)
-> `models` (SQLAlchemy tables). Decisions are pure: `placement.plan_assignments`. Nothing here imports
typer; the CLI imports this package lazily (only `controller serve|migrate` need it).
"""

"""The controller's HTTP API (FastAPI): `create_app(settings)` builds it; routes live one module per noun."""

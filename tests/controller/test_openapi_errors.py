"""The controller's OpenAPI schema declares, for every route, the errors it can answer and their body."""

from __future__ import annotations

from ctl_helpers import Api


def test_every_operation_declares_its_errors_with_the_error_body(api: Api) -> None:
    schema = api.http.get("/openapi.json").json()
    assert set(schema["components"]["schemas"]["ErrorBody"]["properties"]) == {"error"}
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            errors = {status for status in responses if status.startswith(("4", "5"))}
            assert {"413", "422", "500"} <= errors, (method, path)
            if path.startswith("/api/v1/"):
                assert {"401", "403", "503"} <= errors, (method, path)
            if "{" in path:
                assert "404" in errors, (method, path)
            if method in ("post", "put", "delete"):
                assert "409" in errors, (method, path)
            for status in errors:
                body = responses[status]["content"]["application/json"]["schema"]
                assert body == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status)
    assert "HTTPValidationError" not in schema["components"]["schemas"]  # 422s have our shape, not FastAPI's


def test_a_declared_error_is_what_the_api_answers(api: Api) -> None:
    missing = api.call("GET", "/api/v1/deployments/ghost", role="viewer")
    assert missing.status_code == 404 and set(missing.json()["error"]) == {"code", "message", "field"}
    unauthenticated = api.call("GET", "/api/v1/status", role=None)
    assert unauthenticated.status_code == 401 and "error" in unauthenticated.json()

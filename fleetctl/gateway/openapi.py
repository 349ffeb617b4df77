"""What the gateway's OpenAPI schema declares for each route: the request body it reads (the engine
contract's OpenAI request models, which the gateway validates with) and the errors it can answer, in the
OpenAI error shape `{"error": {"message", "type", "param", "code"}}` (errors.py).

The generation routes read their body themselves (the fast path in app.GatewayApp), so FastAPI cannot infer
it: it is declared here with `openapi_extra`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from engine.errors import ErrorBody
from engine.protocol import ChatCompletionRequest, CompletionRequest

MEANINGS = {
    400: "invalid request (`param` names the field), a prompt that does not fit the context window, or a bad "
         "routing header",
    401: "missing or unknown API key",
    403: "canary probe headers (x-fleet-probe) from a key that is not a probe key",
    404: "no such model",
    429: "a client's rate limit, or admission predicting the TTFT SLO would break; retry after Retry-After",
    500: "a bug in the gateway (see its log)",
    502: "every engine tried failed before the first token",
    503: "no routing table yet, no healthy engine for the model, or every engine busy or draining",
    504: "every engine tried timed out before the first token",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's `responses` for the errors it can answer (500 always)."""
    return {status: {"model": ErrorBody, "description": MEANINGS[status]} for status in sorted({*statuses, 500})}


GENERATION_ERRORS = errors(400, 401, 403, 404, 429, 502, 503, 504)


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` declaring a JSON request body of `model` (its schema inlined)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema(
        ref_template="#/components/schemas/{model}")}}}}


def body_models() -> list[type[BaseModel]]:
    return [CompletionRequest, ChatCompletionRequest]


def add_body_schemas(schema: dict[str, Any]) -> dict[str, Any]:
    """Move the nested `$defs` of the inlined request bodies into components (where their refs point)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in body_models():
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if isinstance(body, dict):
                body.pop("$defs", None)
    return schema

"""Keeps `/openapi.json` accurate: every status a route can answer is documented with the error envelope,
streamed bodies as `text/event-stream`, FastAPI's default 422 (we answer 400) is removed, and links between
operations are added (openapi_links.py)."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from shared_engine.entrypoints.openai.openapi_links import add_links
from shared_engine.entrypoints.openai.protocol import ErrorResponse

_DESCRIPTIONS = {
    400: "Invalid request (malformed JSON, wrong types, out-of-range values, context overflow)",
    401: "Missing or invalid API key (only when the server has one)",
    404: "Unknown model",
    413: "Request body too large",
    500: "The engine failed while running this request",
    503: "Overloaded (retry after Retry-After seconds) or the engine is not healthy",
}


# One Server-Sent Event (OpenAPI 3.2's `itemSchema` for event streams): `data` is a JSON chunk, an error
# envelope, or `[DONE]`.
_SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"},
                   "retry": {"type": "integer"}},
}


def error_responses(*codes: int) -> dict:
    return {code: {"model": ErrorResponse, "description": _DESCRIPTIONS[code]} for code in codes}


def stream_responses() -> dict:
    """A generation route: JSON, or SSE with `stream: true`; every error status."""
    ok = {200: {"content": {"text/event-stream": {"itemSchema": _SSE_EVENT}},
                "description": "The response; with stream=true, Server-Sent Events ending in `data: [DONE]`"}}
    return {**ok, **error_responses(400, 401, 404, 413, 500, 503)}


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for path, methods in schema.get("paths", {}).items():
                for operation in methods.values():
                    responses = operation.get("responses", {})
                    responses.pop("422", None)
                    if not path.startswith("/v1/") and operation.get("requestBody"):
                        responses.setdefault("413", _ref_response(413))
            components = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            app.openapi_schema = add_links(schema)
        return app.openapi_schema

    app.openapi = openapi


def _ref_response(code: int) -> dict:
    return {"description": _DESCRIPTIONS[code],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}

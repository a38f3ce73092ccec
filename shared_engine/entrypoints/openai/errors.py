"""`APIError` and the exception handlers that turn every failure into the OpenAI error envelope
`{"error": {"message", "type", "param", "code"}}` with conventions.md's status codes.

Anything a client sends maps to a 4xx; an engine that failed or hung maps to 503 (`EngineDeadError`, also as
the error frame of a stream that had started); a 500 only comes from a bug in the server itself.
"""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("shared_engine.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    500: "internal_server_error",
    503: "service_unavailable_error",
}
RETRY_AFTER_S = 1


class APIError(Exception):
    """An error answered with `status` and the envelope; `headers` (e.g. Retry-After) go with it."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers

    def envelope(self) -> dict:
        return error_body(self.status, self.message, self.param)


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def overloaded(message: str) -> APIError:
    return APIError(503, message, headers={"Retry-After": str(RETRY_AFTER_S)})


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def sse_error(error: APIError) -> str:
    """An error after streaming started: one SSE frame carrying the envelope."""
    return f"data: {json.dumps(error.envelope())}\n\n"


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    if not loc and first.get("type") in ("model_attributes_type", "dict_type"):
        return "the request body must be a JSON object", None
    param = ".".join(loc) or None
    if first.get("type") == "extra_forbidden":
        return f"unknown field `{param}`: this server does not support it", param
    message = first.get("msg", "invalid value")
    return (f"{param}: {message}" if param else message), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        status = exc.status_code if exc.status_code in _TYPES else 400
        return error_response(status, str(exc.detail), None, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception):
        logger.exception("unexpected error while handling a request")
        return error_response(500, f"internal error: {type(exc).__name__}")

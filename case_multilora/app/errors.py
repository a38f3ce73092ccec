"""`GatewayError` and the OpenAI error envelope `{"error": {"message", "type", "param", "code"}}`, as the engine
answers them (code = the HTTP status), plus the gateway's own 429 with `Retry-After`."""

from __future__ import annotations

from fastapi.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",
    502: "bad_gateway_error",
    503: "service_unavailable_error",
}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": status}}


class GatewayError(Exception):
    """An error answered with `status`, the envelope, and `headers` (a 429's `Retry-After`, in seconds)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.status, self.message, self.param), self.status, headers=self.headers)


def rate_limited(message: str, limit: str, retry_after_s: int) -> GatewayError:
    """429 naming the exhausted limit (`requests`, `tokens` or `concurrency`) in `param`."""
    return GatewayError(429, message, param=limit, headers={"Retry-After": str(max(1, retry_after_s))})

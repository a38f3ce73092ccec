"""Read deadlines and a connection cap for uvicorn's HTTP protocols (slowloris).

uvicorn has no header or body read timeout: a client that sends one byte of its request every few seconds
holds a connection (and, mid-body, an ASGI task) for as long as it likes, and enough of them exhaust file
descriptors. `with_deadlines` mixes into uvicorn's httptools or h11 protocol class:

- head: the request line and headers must arrive within `header_read_timeout_s` of the connection opening,
  or of the previous response on the connection finishing (keep-alive idle time counts against it);
- body: the whole body must arrive within `body_read_timeout_s` of the end of the headers;
- past either deadline the server answers 408 with the OpenAI error envelope (when no response has started)
  and closes the connection; a request being processed or a response being streamed has no deadline;
- `max_connections`: a connection beyond that many open ones gets 503 (envelope, `Retry-After`) and is
  closed at once, before anything of it is read.

Phases of a connection: "head" (deadline) -> "body" (deadline) -> "busy" (the app runs; no deadline) ->
"head" again once the response is complete.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from shared_engine.config.validation import check_range

RETRY_AFTER_S = 1  # as errors.RETRY_AFTER_S (not imported: server_config imports this module without FastAPI)


def _raw_response(status: str, message: str, code: int, extra: bytes = b"") -> bytes:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error" if code < 500
                                 else "service_unavailable_error", "param": None, "code": code}}).encode()
    return (b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\nconnection: close\r\n" + extra + b"\r\n" + body)


_408 = {phase: _raw_response("408 Request Timeout", f"the request {phase} was not received in time", 408)
        for phase in ("head", "body")}
_503 = _raw_response("503 Service Unavailable", "too many open connections", 503,
                     b"retry-after: " + str(RETRY_AFTER_S).encode() + b"\r\n")


@dataclass(frozen=True)
class ConnectionLimits:
    """Seconds allowed for a request head and for a body; most open connections (None: no cap)."""

    header_read_timeout_s: float = 10.0
    body_read_timeout_s: float = 30.0
    max_connections: int | None = 2048

    def __post_init__(self) -> None:
        check_range("header_read_timeout_s", self.header_read_timeout_s, 0, low_open=True)
        check_range("body_read_timeout_s", self.body_read_timeout_s, 0, low_open=True)
        if self.max_connections is not None:
            check_range("max_connections", self.max_connections, 1)


class _Deadlines:
    """The mixin (before uvicorn's protocol in the MRO). Subclasses call `_enter` when the parser sees the
    end of the headers ("body") and of the message ("busy")."""

    limits: ConnectionLimits

    def connection_made(self, transport) -> None:
        cap = self.limits.max_connections
        over = cap is not None and len(self.connections) >= cap
        self._phase, self._timer = None, None
        super().connection_made(transport)
        if over:
            transport.write(_503)
            transport.close()
            return
        self._enter("head")

    def connection_lost(self, exc) -> None:
        self._enter(None)
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._enter("head")  # the next request's head (also any body the client still owes)

    def _enter(self, phase: str | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._phase = phase
        if phase in ("head", "body"):
            seconds = self.limits.header_read_timeout_s if phase == "head" else self.limits.body_read_timeout_s
            self._timer = self.loop.call_later(seconds, self._expired, phase)

    def _request_complete(self) -> None:
        """The message has been read: the app has it (or, answered already, the connection waits for a head)."""
        responded = self.cycle is not None and self.cycle.response_complete
        if self._phase == "body":
            self._enter("head" if responded else "busy")
        elif self._phase == "head" and not responded:  # h11 saw the whole request in one go
            self._enter("busy")

    def _expired(self, phase: str) -> None:
        self._timer = None
        if self._phase != phase or self.transport.is_closing():
            return
        cycle = self.cycle
        if phase == "head" and cycle is not None and not cycle.response_complete:
            self._phase = "busy"  # a pipelined request is being answered: not a slow head
            return
        if cycle is None or not cycle.response_started:
            self.transport.write(_408[phase])
        self.transport.close()


def with_deadlines(protocol_class: type, limits: ConnectionLimits) -> type:
    """A subclass of uvicorn's `HttpToolsProtocol` or `H11Protocol` (or of a subclass of either) that
    enforces `limits` (module docstring)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    if issubclass(protocol_class, H11Protocol):
        import h11

        class H11Deadlines(_Deadlines, protocol_class):
            def handle_events(self) -> None:
                super().handle_events()
                state = self.conn.their_state
                if state is h11.SEND_BODY and self._phase == "head":
                    self._enter("body")
                elif state is h11.DONE:
                    self._request_complete()

        H11Deadlines.limits = limits
        return H11Deadlines

    class HttpToolsDeadlines(_Deadlines, protocol_class):
        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            if self._phase == "head" and not self.transport.is_closing():
                self._enter("body")

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._request_complete()

    HttpToolsDeadlines.limits = limits
    return HttpToolsDeadlines

"""Limits on the HTTP request head (request line + headers), enforced while it is read.

The body cap (413, middleware.py) does not bound the head: without these limits a 16 MB header or 20,000
headers are read into memory and parsed before any application code runs. `uvicorn_http_options` returns
uvicorn's `http` settings: with httptools (uvicorn's default where it is installed) a protocol that counts
the head's bytes as they arrive and answers 431 past `max_header_bytes` or `max_headers`; with h11 its own
incomplete-event cap (h11 then answers 400). `HeaderCountMiddleware` (middleware.py) checks the count
again for any server.
"""

from __future__ import annotations

import json
from typing import Any

from shared_engine.entrypoints.openai.http_deadlines import ConnectionLimits, with_deadlines

_BODY = json.dumps({"error": {"message": "request header fields too large", "type": "invalid_request_error",
                              "param": None, "code": 431}}).encode()
_RESPONSE_431 = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                 b"content-length: " + str(len(_BODY)).encode() + b"\r\nconnection: close\r\n\r\n" + _BODY)


class _HeadTooLarge(Exception):
    pass


def limited_httptools_protocol(max_header_bytes: int, max_headers: int) -> type:
    """A uvicorn httptools protocol that answers 431 and closes the connection once a request head passes
    `max_header_bytes` bytes or `max_headers` headers. Raises `ImportError` without httptools."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            self._head_bytes, self._in_head, self._head_rejected = 0, True, False
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            if not self._in_head:
                return super().data_received(data)
            room = max_header_bytes - self._head_bytes
            if len(data) <= room:
                self._head_bytes += len(data)
                return super().data_received(data)
            super().data_received(data[:room])  # the head may end within the allowed bytes
            self._head_bytes = max_header_bytes
            if self._in_head:
                return self._reject()
            return super().data_received(data[room:])

        def on_header(self, name: bytes, value: bytes) -> None:
            if len(self.headers) >= max_headers:
                self._head_rejected = True
                raise _HeadTooLarge()
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_bytes, self._in_head = 0, True  # the next request on this connection

        def send_400_response(self, msg: str) -> None:
            if self._head_rejected:  # on_header refused a header: the parser reports it as an error
                return self._reject()
            super().send_400_response(msg)

        def _reject(self) -> None:
            if not self.transport.is_closing():
                self.transport.write(_RESPONSE_431)
                self.transport.close()

    return LimitedHttpToolsProtocol


def uvicorn_http_options(max_header_bytes: int, max_headers: int, httptools: bool = True,
                         limits: ConnectionLimits | None = None) -> dict[str, Any]:
    """Keyword arguments for `uvicorn.run` / `uvicorn.Config` that enforce the head limits (h11 when
    `httptools` is False or not installed) and, with `limits`, the read deadlines and the connection cap
    (http_deadlines.py)."""
    if httptools:
        try:
            protocol = limited_httptools_protocol(max_header_bytes, max_headers)
            return {"http": protocol if limits is None else with_deadlines(protocol, limits)}
        except ImportError:
            pass
    if limits is None:
        return {"http": "h11", "h11_max_incomplete_event_size": max_header_bytes}
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return {"http": with_deadlines(H11Protocol, limits), "h11_max_incomplete_event_size": max_header_bytes}

"""`SseRelay`: the engine's SSE stream as the client gets it, with the per-chunk work kept off most chunks.

The gateway reads three things from a stream: the first token (TTFT), the usage chunk (the token metrics
and the limiter's excess charge; dropped, or its `usage` nulled, unless the client asked for it) and an
error chunk (the request's status). Every other chunk is relayed byte for byte. Parsing each chunk's JSON
and writing it again, one send per line, cost the gateway's one event loop about as much per chunk as the
engine's whole encoding, and a well-behaved tenant's first token waited behind every whale chunk that
arrived in the same loop iteration (case_multilora/loadtest/http_path_bench.py measures it).

So `feed` takes the bytes as they arrive, cuts them at the last complete event (a blank line) and returns
the complete events as one block (one send for whatever arrived together). An event is parsed only while
the first token has not been seen, or when it may hold a usage object or an error (`"usage": {` /
`"error"` in its bytes: JSON escapes quotes inside strings, so a token's text cannot produce either), or
when it is anything but one `data:` line; every other event is passed on as is.
Parsed events go out as before: `data: <payload>\\n\\n`, non-`data:` lines dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

_MAY_MATTER = re.compile(rb'"usage"\s*:\s*\{|"error"')


class SseRelay:
    """One stream's relay. After each `feed`: `usage` (the last usage object seen, or None) and `status`
    (an error chunk's code as a string, or None). Raises ValueError (json) for an event that is not JSON."""

    def __init__(self, client_wants_usage: bool, on_first_token: Callable[[], None]) -> None:
        self.client_wants_usage = client_wants_usage
        self.on_first_token = on_first_token
        self.first_pending = True
        self.usage: dict | None = None
        self.status: str | None = None
        self._tail = b""

    def feed(self, data: bytes) -> bytes:
        """The complete events among the bytes received so far, as the client gets them (b"" if none)."""
        data = self._tail + data
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        end = data.rfind(b"\n\n")
        if end < 0:
            self._tail = data
            return b""
        block, self._tail = data[:end + 2], data[end + 2:]
        if self._plain(block):
            return block
        return b"".join(e + b"\n\n" if self._plain(e + b"\n\n") else self._event(e)
                        for e in block.split(b"\n\n")[:-1])  # in order: the first token moves on

    def close(self) -> bytes:
        """A last event the engine ended without its blank line."""
        tail, self._tail = self._tail, b""
        return self._event(tail) if tail.strip() else b""

    def _plain(self, events: bytes) -> bool:
        """Nothing in `events` (complete) needs reading: they go to the client as they are."""
        return not self.first_pending and not _MAY_MATTER.search(events) and _only_data_lines(events)

    def _event(self, event: bytes) -> bytes:
        out = []
        for line in event.split(b"\n"):
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload != b"[DONE]":
                chunk = json.loads(payload)
                if chunk.get("usage"):
                    self.usage = chunk["usage"]
                    if not self.client_wants_usage and chunk.get("choices") == []:
                        continue
                    if not self.client_wants_usage:
                        chunk["usage"] = None
                        payload = json.dumps(chunk).encode()
                if "error" in chunk:
                    self.status = str(chunk["error"].get("code") or 500)
                elif self.first_pending and any(c.get("delta", {}).get("content") or c.get("text")
                                                for c in chunk.get("choices") or []):  # a token, not the role
                    self.first_pending = False
                    self.on_first_token()
            out.append(b"data: " + payload + b"\n\n")
        return b"".join(out)


def _only_data_lines(block: bytes) -> bool:
    """Every event in `block` (complete events) is one `data: ` line."""
    events = block.count(b"\n\n")
    return (block.startswith(b"data: ") and block.count(b"\n") == 2 * events
            and block.count(b"\n\ndata: ") == events - 1)

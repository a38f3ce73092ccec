"""The RAG case's locust user (case_rag_chatbot/loadtest/locustfile.py) plus a log of every request event:
one JSON line per event (`t` unix seconds, `type`, `name`, `ms`, `error`) in $SOAK_EVENTS, so the soak's
summary can compute latency percentiles per time window (locust's own CSV keeps only run totals)."""

from __future__ import annotations

import json
import os
import time

from locust import events

from case_rag_chatbot.loadtest.locustfile import RagChatUser  # noqa: F401 - the user class locust runs

_log = open(os.environ.get("SOAK_EVENTS", "soak_events.jsonl"), "a", buffering=1)  # noqa: SIM115 - whole run


@events.request.add_listener
def _record(request_type, name, response_time, exception=None, **_) -> None:
    _log.write(json.dumps({"t": round(time.time(), 3), "type": request_type, "name": name,
                           "ms": round(response_time or 0, 1),
                           "error": None if exception is None else str(exception)[:200]}) + "\n")

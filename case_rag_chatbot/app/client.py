"""`ask`: one question to the app's `POST /chat`, its SSE events gathered into an `Answer` (the demo, the
tests and `python -m case_rag_chatbot.app ask` use it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx


@dataclass
class Answer:
    question: str
    text: str = ""
    sources: list[dict] = field(default_factory=list)   # [{"n", "title", "source", "distance"}]
    done: dict = field(default_factory=dict)             # the `done` event's data
    num_token_events: int = 0
    error: dict | None = None


def parse_sse(lines) -> list[tuple[str, dict]]:
    """(event name, data) pairs from SSE lines (`event:` then `data:` lines, a blank line ends an event)."""
    events, name, data = [], "message", []
    for line in [*lines, ""]:
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            events.append((name, json.loads("\n".join(data))))
            name, data = "message", []
    return events


def ask(app_url: str, question: str, on_text: Callable[[str], None] | None = None, timeout_s: float = 300,
        **options) -> Answer:
    """Stream one answer; `on_text` sees each token event's text as it arrives.

    Raises:
        httpx.HTTPStatusError: the app refused the request (400 for a bad body).
    """
    answer = Answer(question)
    body = {"question": question, **options}
    with httpx.stream("POST", app_url.rstrip("/") + "/chat", json=body, timeout=timeout_s) as response:
        if response.status_code != 200:
            response.read()
            response.raise_for_status()
        pending: list[str] = []
        for line in response.iter_lines():
            pending.append(line)
            if line:
                continue
            for name, data in parse_sse(pending):
                _apply(answer, name, data, on_text)
            pending = []
        for name, data in parse_sse(pending):
            _apply(answer, name, data, on_text)
    return answer


def _apply(answer: Answer, name: str, data: dict, on_text) -> None:
    if name == "sources":
        answer.sources = data["sources"]
    elif name == "token":
        answer.text += data["text"]
        answer.num_token_events += 1
        if on_text:
            on_text(data["text"])
    elif name == "done":
        answer.done = data
    elif name == "error":
        answer.error = data["error"]

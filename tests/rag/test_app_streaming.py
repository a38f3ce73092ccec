"""The app against the real engine (both as subprocesses): `/chat` streams sources, then tokens as they are
generated, then `done`; the demo's questions get answers whose sources are the right documentation; the
fixed system prompt is a prefix-cache hit on every request after the first."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from case_rag_chatbot.app.client import ask, parse_sse
from case_rag_chatbot.demo import QUESTIONS, expected_source


def stream_events(url: str, body: dict) -> list[tuple[float, str, dict]]:
    """(arrival time, event, data) for every SSE event of one `/chat` answer."""
    events, pending = [], []
    with httpx.stream("POST", url + "/chat", json=body, timeout=300) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            pending.append(line)
            if not line:
                events += [(time.perf_counter(), name, data) for name, data in parse_sse(pending)]
                pending = []
    return events


def test_health_search_and_page(app):
    health = httpx.get(app.url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["num_chunks"] >= 300
    chunks = httpx.get(app.url + "/search", params={"q": "the pass statement", "k": 2}, timeout=30).json()["chunks"]
    assert len(chunks) == 2 and chunks[0]["source"].endswith("/reference/simple_stmts.html#pass")
    page = httpx.get(app.url + "/", timeout=10)
    assert page.status_code == 200 and 'id="question"' in page.text and 'fetch("/chat"' in page.text


def test_chat_streams_sources_then_tokens_then_done(app):
    events = stream_events(app.url, {"question": "What does the pass statement do?", "max_tokens": 24})
    names = [name for _, name, _ in events]
    assert names[0] == "sources" and names[-1] == "done" and set(names[1:-1]) == {"token"}, names
    sources = events[0][2]["sources"]
    assert [s["n"] for s in sources] == [1, 2, 3, 4]
    assert any(s["source"].endswith("/reference/simple_stmts.html#pass") for s in sources)
    tokens = [(t, data["text"]) for t, name, data in events if name == "token"]
    assert len(tokens) >= 2 and "".join(text for _, text in tokens).strip()
    assert tokens[-1][0] > tokens[0][0]  # tokens arrive over time, not in one buffered block
    done = events[-1][2]
    usage = done["usage"]
    assert 1 <= usage["completion_tokens"] <= 24 and usage["prompt_tokens"] > 700
    assert done["finish_reason"] in ("stop", "length") and done["ttft_ms"] > 0 and done["e2e_ms"] >= done["ttft_ms"]


@pytest.mark.parametrize("question", QUESTIONS, ids=[q.text[:40] for q in QUESTIONS])
def test_demo_question_is_answered_with_its_sources(app, question):
    answer = ask(app.url, question.text, max_tokens=32)
    assert answer.error is None
    assert answer.text.strip() and answer.num_token_events >= 2
    assert any(s["source"].startswith(expected_source(question)) for s in answer.sources), answer.sources
    assert answer.done["usage"]["completion_tokens"] >= 1


def test_system_prompt_is_a_prefix_cache_hit(app, default_model_dir):
    from transformers import AutoTokenizer

    from case_rag_chatbot.app.system_prompt import load_system_prompt

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir))
    system_tokens = len(tokenizer(load_system_prompt(1024), add_special_tokens=False)["input_ids"])
    ask(app.url, "How do I import a module under a different name?", max_tokens=4)
    second = ask(app.url, "What does the global statement do?", max_tokens=4)
    cached = second.done["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Every full 16-token block of the chat header and the system prompt is shared with the first request.
    assert cached >= system_tokens - 16, (cached, system_tokens)


def test_bad_request_gets_400_with_an_error_envelope(app):
    response = httpx.post(app.url + "/chat", json={"question": ""}, timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("question")
    response = httpx.post(app.url + "/chat", content=b"not json", timeout=10,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and json.loads(response.text)["error"]["code"] == 400

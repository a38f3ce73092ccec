"""handed.md K14 "a request over the context limit hanging instead of a 400", at the exact boundary and in every
shape (test_k3_validation.py's H06 covers a long text prompt, not streamed): on the server with max_model_len
128, token-id and text prompts, streamed or not, one prompt or a list, n 2, completions and chat, are answered
at once (well inside the 10 s client timeout) -- 400 with the error envelope naming the limit and the requested
total, or, at the boundary, served to exactly the limit with finish_reason "length" -- and the server keeps
serving."""

from __future__ import annotations

import httpx
import pytest

LIMIT = 128
TIMEOUT = 10  # seconds: a request that hangs fails here instead of holding the suite


def _ids(tokenizer, n: int) -> list[int]:
    ids = tokenizer.encode(" ".join(["word"] * (2 * n)))[:n]
    assert len(ids) == n
    return ids


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=TIMEOUT)


def _refused(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")  # an error, not an event stream
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
    assert f"maximum context length is {LIMIT} tokens" in error["message"], error
    assert all(w in error["message"] for w in words), error


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("prompt_len, max_tokens, words", [
    (LIMIT, None, ["prompt has 128 tokens", "no room"]),  # nothing left for one output token
    (LIMIT - 1, 2, ["requested 129 tokens", "127 in the prompt, 2 for the completion"]),  # one over
    (LIMIT + 50, 1, ["requested 179 tokens"]),
    (5, LIMIT, ["requested 133 tokens", "5 in the prompt"]),  # a short prompt, max_tokens alone too many
])
def test_completions_over_the_limit_are_400_at_once(small_server, tokenizer, stream, prompt_len, max_tokens, words):
    # max_tokens null (not the completions default of 16) asks for up to the limit
    body = {"prompt": _ids(tokenizer, prompt_len), "max_tokens": max_tokens, "stream": stream}
    _refused(_post(small_server, "/v1/completions", body), *words)
    text = tokenizer.decode(body["prompt"])
    _refused(_post(small_server, "/v1/completions", {**body, "prompt": [text, "Hi"], "n": 2}))


@pytest.mark.parametrize("stream", [False, True])
def test_chat_over_the_limit_is_400_at_once(small_server, tokenizer, stream):
    long = {"messages": [{"role": "user", "content": " ".join(["word"] * 200)}], "stream": stream}
    _refused(_post(small_server, "/v1/chat/completions", long), "leaves no room")
    short = {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": LIMIT, "stream": stream}
    _refused(_post(small_server, "/v1/chat/completions", short), "for the completion")


@pytest.mark.parametrize("max_tokens", [None, 1])
def test_at_the_limit_is_served_to_exactly_the_limit(small_server, tokenizer, max_tokens):
    body = {"prompt": _ids(tokenizer, LIMIT - 1), "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    r = _post(small_server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["usage"] == {**data["usage"], "prompt_tokens": LIMIT - 1, "completion_tokens": 1, "total_tokens": LIMIT}
    assert data["choices"][0]["finish_reason"] == "length"
    frames = small_server.stream("/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert frames[-1]["usage"]["total_tokens"] == LIMIT
    assert [c["finish_reason"] for f in frames for c in f["choices"] if c["finish_reason"]] == ["length"]


def test_the_server_keeps_serving_after_refusals(small_server, tokenizer):
    for _ in range(5):
        _refused(_post(small_server, "/v1/completions", {"prompt": _ids(tokenizer, LIMIT), "max_tokens": 4}))
    r = _post(small_server, "/v1/completions", {"prompt": "Hi", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert small_server.metric("vllm:num_requests_running") == 0
    assert small_server.metric("vllm:num_requests_waiting") == 0

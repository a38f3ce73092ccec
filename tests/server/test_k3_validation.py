"""K3 (handed.md H05-H08): input validation before the engine, exact boundaries, the server survives."""

from __future__ import annotations

import json
import math

import pytest

CHAT_OK = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def _assert_error(r, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def _survives(server) -> None:
    assert server.post("/v1/chat/completions", CHAT_OK).status_code == 200


def test_h05_empty_prompts(server):
    for prompt in ("", [""], [], [[]]):
        _assert_error(server.post("/v1/completions", {"prompt": prompt}), 400)
    _assert_error(server.post("/v1/chat/completions", {"messages": []}), 400)
    _survives(server)


def test_h06_context_overflow(small_server, tokenizer):
    long_text = " ".join(["word"] * 300)
    n = len(tokenizer.encode(long_text))
    assert n >= 250
    error = _assert_error(small_server.post("/v1/completions", {"prompt": long_text, "max_tokens": 5}), 400)
    assert "128" in error["message"] and str(n) in error["message"] and "5" in error["message"]
    chat = {"messages": [{"role": "user", "content": long_text}], "max_tokens": 5}
    error = _assert_error(small_server.post("/v1/chat/completions", chat), 400)
    rendered = small_server.post("/tokenize", {"messages": chat["messages"]}).json()["count"]
    assert "128" in error["message"] and str(rendered) in error["message"]
    _survives(small_server)


def test_h07_max_tokens_null_is_up_to_the_limit(small_server):
    r = small_server.post("/v1/completions", {"prompt": "Count: 1, 2, 3,", "max_tokens": None,
                                               "temperature": 0, "ignore_eos": True}).json()
    assert r["usage"]["total_tokens"] == 128 and r["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("max_tokens", [0, -5])
def test_h07_max_tokens_zero_or_negative(server, max_tokens):
    _assert_error(server.post("/v1/completions", {"prompt": "Hi", "max_tokens": max_tokens}), 400)
    _assert_error(server.post("/v1/chat/completions", {**CHAT_OK, "max_tokens": max_tokens}), 400)


def test_h07_max_tokens_one(server):
    r = server.post("/v1/completions", {"prompt": "Hi there", "max_tokens": 1}).json()
    assert r["usage"]["completion_tokens"] == 1 and r["choices"][0]["finish_reason"] == "length"
    frames = server.stream("/v1/completions", {"prompt": "Hi there", "max_tokens": 1, "stream": True,
                                               "stream_options": {"include_usage": True}})
    assert frames[-1]["usage"]["completion_tokens"] == 1
    assert [c["finish_reason"] for f in frames for c in f["choices"] if c["finish_reason"]] == ["length"]
    for stream in (False, True):
        body = {**CHAT_OK, "max_tokens": 1, "stream": stream, "stream_options": {"include_usage": True}}
        if stream:
            frames = server.stream("/v1/chat/completions", body)
            usage, reasons = frames[-1]["usage"], [c["finish_reason"] for f in frames for c in f["choices"]]
        else:
            r = server.post("/v1/chat/completions", {**body, "stream_options": None}).json()
            usage, reasons = r["usage"], [r["choices"][0]["finish_reason"]]
        assert usage["completion_tokens"] == 1 and "length" in reasons


def _strict_json(text: str):
    def reject(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=reject)


def test_h08_echo_scoring(server, tokenizer):
    prompt = "correct horse battery staple"
    r = server.post("/v1/completions", {"prompt": prompt, "echo": True, "max_tokens": 0, "logprobs": 1})
    assert r.status_code == 200, r.text
    body = _strict_json(r.text)
    choice, usage = body["choices"][0], body["usage"]
    assert choice["text"] == prompt
    lp = choice["logprobs"]
    n = len(tokenizer.encode(prompt))
    assert len(lp["tokens"]) == n == usage["prompt_tokens"] and usage["completion_tokens"] == 0
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(x, float) and math.isfinite(x) for x in lp["token_logprobs"][1:])
    assert "".join(lp["tokens"]) == prompt


def test_h08_echo_with_generation(server):
    prompt = "correct horse battery staple"
    body = {"prompt": prompt, "echo": True, "logprobs": 1, "temperature": 1, "top_k": 1, "max_tokens": 5}
    r = server.post("/v1/completions", body)
    data = _strict_json(r.text)
    choice, usage = data["choices"][0], data["usage"]
    assert choice["text"].startswith(prompt) and len(choice["text"]) > len(prompt)
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert len(choice["logprobs"]["tokens"]) == usage["total_tokens"]
    assert choice["logprobs"]["token_logprobs"][0] is None
    greedy = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 5, "temperature": 0}).json()
    assert choice["text"] == prompt + greedy["choices"][0]["text"]  # top_k 1 is greedy

"""K4 (handed.md H09, H10): one error envelope, one status policy; never a 500 for client input."""

from __future__ import annotations

import httpx
import pytest


def _assert_envelope(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize("raw", ['{"model":"m","messages":[],x}', "[]", "null", "123", '"text"', "",
                                 '{"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}',
                                 '{"messages": [{"role": "user", "content": "hi"}], "n": 0}',
                                 '{"messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}',
                                 '{"messages": [{"role": "wizard", "content": "hi"}]}',
                                 '{"messages": [{"role": "user", "content": "\\ud800"}]}'])
def test_h09_malformed_bodies_are_400(server, raw):
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=30)
        _assert_envelope(r, 400)


def test_h09_temperature_hot_names_the_field(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}
    assert _assert_envelope(server.post("/v1/chat/completions", body), 400)["param"] == "temperature"


def test_h09_limits_from_config(server):
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert "n" in _assert_envelope(server.post("/v1/chat/completions", {**chat, "n": 17}), 400)["message"]
    body = {**chat, "logprobs": True, "top_logprobs": 21}
    assert "20" in _assert_envelope(server.post("/v1/chat/completions", body), 400)["message"]


def test_h10_unknown_model_is_404(server):
    body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    error = _assert_envelope(server.post("/v1/chat/completions", body), 404)
    assert "no-such-model" in error["message"] and error["param"] == "model"
    _assert_envelope(server.post("/v1/completions", {"model": "x", "prompt": "hi"}), 404)
    for model in (None, server.model):
        r = server.post("/v1/chat/completions", {**body, "model": model}).json()
        assert r["model"] == server.model


def test_unknown_route_and_method(server):
    _assert_envelope(server.get("/v1/nothing"), 404)
    _assert_envelope(server.get("/v1/completions"), 405)


def test_body_too_large_is_413(server):
    huge = b'{"prompt": "' + b"a" * (8 * 1024 * 1024 + 10) + b'"}'
    r = httpx.post(server.url + "/v1/completions", content=huge, headers={"content-type": "application/json"},
                   timeout=60)
    _assert_envelope(r, 413)

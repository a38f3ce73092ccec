"""OpenAI fidelity as clients see it: unknown fields and unsupported features are 400s naming the field,
`GET /v1/models/{id}`, the `developer` role, prompt top-k logprobs with `echo` and `prompt_logprobs`,
streamed `text_offset`, `logit_bias`, client request ids, and `cache_salt` isolation."""

from __future__ import annotations

import json
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

PROMPT = "The quick brown fox jumps over the lazy dog because"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _error(r) -> dict:
    assert r.status_code == 400, r.text
    return r.json()["error"]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}, "frobnicate"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "functions": []}, "functions"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi", "audio": {}}]}, "messages.0.audio"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
     "messages.0.content.1.type"),
    ("/v1/completions", {"prompt": "hi", "suffix": " the end"}, "suffix"),
    ("/v1/completions", {"prompt": "hi", "best_of": 3}, "best_of"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                              "top_logprobs": 21}, "top_logprobs"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True, "x": 1}}, "stream_options.x"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "min_tokens": 3,
                              "response_format": {"type": "json_object"}}, "min_tokens"),
])
def test_unsupported_fields_are_400_naming_them(server, path, body, param):
    error = _error(server.post(path, {"model": server.model, "max_tokens": 2, **body}))
    assert error["param"] == param, error
    assert server.post("/v1/completions", {"prompt": "hi", "max_tokens": 1}).status_code == 200


def test_models_retrieve(client, server):
    card = client.models.retrieve(server.model)
    assert card.id == server.model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_developer_role_is_system(server, tokenizer):
    messages = [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
    r = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 3, "temperature": 0})
    system = [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]
    expected = tokenizer.apply_chat_template(system, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(expected)
    ref = server.post("/v1/chat/completions", {"messages": system, "max_tokens": 3, "temperature": 0}).json()
    assert r.json()["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]


def _completion(server, **body) -> dict:
    r = server.post("/v1/completions", {"model": server.model, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_prompt_positions_carry_top_k(server, tokenizer):
    """Position i of the echoed prompt carries the top k that a 1-token completion of prompt[:i] reports."""
    k = 3
    body = _completion(server, prompt=PROMPT, max_tokens=1, echo=True, logprobs=k)
    lp = body["choices"][0]["logprobs"]
    ids = tokenizer.encode(PROMPT)
    assert lp["top_logprobs"][0] is None and len(lp["tokens"]) == len(ids) + 1
    for i in (1, 4, len(ids) - 1):
        top = lp["top_logprobs"][i]
        assert len(top) in (k, k + 1) and lp["tokens"][i] in top
        step = _completion(server, prompt=ids[:i], max_tokens=1, logprobs=k)["choices"][0]["logprobs"]
        assert len(step["top_logprobs"][0]) == k and set(step["top_logprobs"][0]) <= set(top)
        for token, value in step["top_logprobs"][0].items():
            assert top[token] == pytest.approx(value, abs=1e-3)


def test_prompt_logprobs_k(server, tokenizer):
    choice = _completion(server, prompt=PROMPT, max_tokens=1, prompt_logprobs=2)["choices"][0]
    entries = choice["prompt_logprobs"]
    ids = tokenizer.encode(PROMPT)
    assert entries[0] is None and len(entries) == len(ids)
    for token_id, entry in zip(ids[1:], entries[1:]):
        assert str(token_id) in entry and sum(e["rank"] <= 2 for e in entry.values()) == 2
        assert entry[str(token_id)]["rank"] >= 1
    chat = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
                                                "prompt_logprobs": 1}).json()
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"] and chat["prompt_logprobs"][0] is None
    assert all(1 <= len(e) <= 2 for e in chat["prompt_logprobs"][1:])


def test_streamed_text_offset_counts_from_the_start(server):
    body = {"prompt": PROMPT, "max_tokens": 12, "echo": True, "logprobs": 1, "temperature": 0}
    whole = _completion(server, **body)["choices"][0]["logprobs"]
    frames = server.stream("/v1/completions", {**body, "stream": True})
    offsets = [o for f in frames for c in f["choices"] if c["logprobs"] for o in c["logprobs"]["text_offset"]]
    assert len(frames) > 2 and offsets == whole["text_offset"]
    assert offsets == sorted(offsets) and offsets[-1] > len(PROMPT)


def test_logit_bias_changes_greedy_choice(server, tokenizer):
    free = _completion(server, prompt=PROMPT, max_tokens=3)["choices"][0]["text"]
    first = tokenizer.encode(free)[0]
    biased = _completion(server, prompt=PROMPT, max_tokens=3, logit_bias={str(first): -100})["choices"][0]["text"]
    assert tokenizer.encode(biased)[0] != first
    (banana,) = tokenizer.encode(" banana")
    forced = _completion(server, prompt=PROMPT, max_tokens=3, logit_bias={str(banana): 100})["choices"][0]["text"]
    assert forced == " banana" * 3


def test_client_request_id_and_duplicates(server):
    body = {"model": server.model, "prompt": PROMPT, "max_tokens": 300, "ignore_eos": True, "request_id": "dup-1",
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as running:
        lines = running.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["id"] == "cmpl-dup-1"
        duplicate = server.post("/v1/completions", {**body, "stream": False, "max_tokens": 2})
        assert _error(duplicate)["param"] == "request_id"
    # closed: the id is free again once the server has seen the disconnect, also for n > 1 (whose choices
    # get derived ids)
    for _ in range(100):
        again = server.post("/v1/completions", {**body, "stream": False, "max_tokens": 2, "n": 2})
        if again.status_code != 400:
            break
        time.sleep(0.1)
    assert again.status_code == 200 and again.json()["id"] == "cmpl-dup-1" and len(again.json()["choices"]) == 2


def test_cache_salt_isolates_prefix_cache(server):
    prompt = "Tenant document: " + " ".join(f"item{i}" for i in range(60))
    def cached(salt=None):
        extra = {} if salt is None else {"cache_salt": salt}
        return _completion(server, prompt=prompt, max_tokens=1, **extra)["usage"]["prompt_tokens_details"][
            "cached_tokens"]
    cached("tenant-a")
    assert cached("tenant-a") >= 48  # the same salt hits its own blocks
    assert cached("tenant-b") == 0 and cached() == 0  # another salt, or none, sees nothing


def test_cache_salt_isolates_chat_prefixes(server):
    """Chat takes `cache_salt` too: the salt keys the first block, so even the template's shared system
    block is not shared across salts."""
    messages = [{"role": "user", "content": "Tenant document: " + " ".join(f"line{i}" for i in range(60))}]

    def cached(salt):
        r = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 1, "cache_salt": salt})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    cached("chat-a")
    assert cached("chat-a") >= 48
    assert cached("chat-b") == 0

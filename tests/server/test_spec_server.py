"""Speculative decoding through the OpenAI server (issue 17, handed.md K10): a server with n-gram drafting
(k 5, policy `always`) answers greedy requests exactly as the server without speculation does -- text,
`finish_reason`, `usage` and logprobs -- streamed and not, with a stop string, a stop token or `max_tokens`
landing inside an accepted run; a stream carries nothing past the stop and its usage counts the tokens it sent.
The engine-level identity tests (tests/engine/test_spec_decode_greedy.py) do not cover the HTTP layer, where a
step's several tokens become SSE deltas."""

from __future__ import annotations

import json
import uuid

import pytest
from sse_helpers import finish_reasons, joined_text

from tests.server.conftest import _stop, start_server

# repetitive text: n-gram lookup drafts from the prompt, so most steps carry several accepted tokens
PROMPTS = [
    "Here is the English alphabet: A B C D E F G H I J K L M N O P Q R S T U V W X Y Z. Again: A B C",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n",
    "one two three four, one two three four, one two three four, one two",
]
SPEC = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
        "policy": "always"}


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory, default_model_dir):
    proc, srv = start_server(tmp_path_factory.mktemp("spec-server"), "--max-model-len", "1024",
                             "--speculative-config", json.dumps(SPEC))
    yield srv
    _stop(proc)


def _completion(server, prompt: str, **fields) -> dict:
    body = {"prompt": prompt, "temperature": 0, "logprobs": 1, **fields}
    r = server.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def _counts(usage: dict) -> dict:
    """Usage without `prompt_tokens_details`: the session-wide `server` has served other tests' prompts, so its
    cached tokens depend on the test order (cached tokens with speculation on vs off: test_spec_decode_greedy)."""
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def _same(off: dict, on: dict) -> None:
    a, b = off["choices"][0], on["choices"][0]
    assert (b["text"], b["finish_reason"]) == (a["text"], a["finish_reason"])
    assert _counts(on["usage"]) == _counts(off["usage"])
    assert b["logprobs"]["tokens"] == a["logprobs"]["tokens"]
    assert b["logprobs"]["token_logprobs"] == pytest.approx(a["logprobs"]["token_logprobs"], abs=2e-3)
    assert len(b["logprobs"]["tokens"]) == on["usage"]["completion_tokens"]


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 7, 11, 13, 18])
def test_max_tokens_inside_an_accepted_run(server, spec_server, max_tokens):
    before = spec_server.metric("vllm:spec_decode_num_accepted_tokens_total")
    for prompt in PROMPTS:
        on = _completion(spec_server, prompt, max_tokens=max_tokens)
        _same(_completion(server, prompt, max_tokens=max_tokens), on)
        assert on["usage"]["completion_tokens"] == max_tokens or on["choices"][0]["finish_reason"] == "stop"
    if max_tokens >= 5:  # the drafts were accepted: the identity above is not speculation-free
        assert spec_server.metric("vllm:spec_decode_num_accepted_tokens_total") > before


def _stops(server, prompt: str) -> list[str]:
    """Stop strings cut from the unstopped greedy text at several offsets (inside multi-token runs)."""
    text = _completion(server, prompt, max_tokens=24)["choices"][0]["text"]
    return [text[i:i + 3] for i in (4, 9, 15) if len(text[i:i + 3].strip()) == 3]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_stop_strings_streamed_and_not(server, spec_server, prompt):
    stops = _stops(server, prompt)
    assert stops
    for stop in stops:
        fields = {"max_tokens": 24, "stop": [stop]}
        off, on = _completion(server, prompt, **fields), _completion(spec_server, prompt, **fields)
        _same(off, on)
        assert stop not in on["choices"][0]["text"]
        body = {"prompt": prompt, "temperature": 0, "logprobs": 1, "stream": True,
                "stream_options": {"include_usage": True}, **fields}
        frames = spec_server.stream("/v1/completions", body)
        assert joined_text(frames) == {0: on["choices"][0]["text"]}
        assert finish_reasons(frames) == {0: on["choices"][0]["finish_reason"]}
        streamed_tokens = [t for f in frames for c in f["choices"] for t in (c.get("logprobs") or {}).get("tokens", [])]
        assert streamed_tokens == on["choices"][0]["logprobs"]["tokens"]
        assert _counts(frames[-1]["usage"]) == _counts(on["usage"])


def test_stop_token_id_inside_an_accepted_run(server, spec_server, tokenizer):
    """A stop token id taken from the middle of the unstopped greedy output: both servers stop at its first
    occurrence, the same text and usage."""
    prompt = PROMPTS[2]
    ids = tokenizer(_completion(server, prompt, max_tokens=18)["choices"][0]["text"], add_special_tokens=False)
    stop_id = ids["input_ids"][len(ids["input_ids"]) // 2]
    fields = {"max_tokens": 18, "stop_token_ids": [stop_id]}
    off, on = _completion(server, prompt, **fields), _completion(spec_server, prompt, **fields)
    _same(off, on)
    assert on["choices"][0]["finish_reason"] == "stop"
    assert on["usage"]["completion_tokens"] < 18


def test_chat_stream_usage_counts_the_tokens_sent(server, spec_server):
    body = {"messages": [{"role": "user", "content": "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12"}],
            "temperature": 0, "max_tokens": 17, "logprobs": True, "stream": True,
            "stream_options": {"include_usage": True}}
    off, on = (s.stream("/v1/chat/completions", body) for s in (server, spec_server))
    assert joined_text(on, chat=True) == joined_text(off, chat=True)
    sent = [t for f in on for c in f["choices"] for t in ((c.get("logprobs") or {}).get("content") or [])]
    assert _counts(on[-1]["usage"]) == _counts(off[-1]["usage"])
    assert len(sent) == on[-1]["usage"]["completion_tokens"]


_COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:prefix_cache_queries_total",
             "vllm:prefix_cache_hits_total", "vllm:iteration_tokens_total_sum", "vllm:iteration_tokens_total_count")


def _metrics(server) -> dict[str, float]:
    return {name: server.metric(name) for name in _COUNTERS}


def test_metrics_count_tokens_not_steps_or_drafts(server, spec_server):
    """/metrics after the same requests (each prompt twice: the second hits the prefix cache) on both servers: the
    prompt, generation, prefix-cache and per-step token counters grow by the same amounts, the generation tokens
    by the completion tokens returned (not drafted, not steps); only the step count (iteration_tokens' count)
    is smaller with speculation. A tag unique to this run keeps earlier tests' cached blocks out of the hits."""
    tag = uuid.uuid4().hex[:8]
    before = {s.url: _metrics(s) for s in (server, spec_server)}
    accepted = spec_server.metric("vllm:spec_decode_num_accepted_tokens_total")
    completion_tokens = {}
    for s in (server, spec_server):
        used = [_completion(s, f"{tag} {prompt}", max_tokens=16)["usage"] for prompt in PROMPTS * 2]
        completion_tokens[s.url] = sum(u["completion_tokens"] for u in used)
    grown = {s.url: {k: v - before[s.url][k] for k, v in _metrics(s).items()} for s in (server, spec_server)}
    off, on = grown[server.url], grown[spec_server.url]
    assert spec_server.metric("vllm:spec_decode_num_accepted_tokens_total") - accepted > 10
    assert completion_tokens[spec_server.url] == completion_tokens[server.url] == on["vllm:generation_tokens_total"]
    steps = "vllm:iteration_tokens_total_count"
    assert {k: v for k, v in on.items() if k != steps} == {k: v for k, v in off.items() if k != steps}
    assert on["vllm:prefix_cache_hits_total"] > 0
    assert on["vllm:iteration_tokens_total_sum"] == on["vllm:prompt_tokens_total"] + on["vllm:generation_tokens_total"]
    assert on[steps] < off[steps]

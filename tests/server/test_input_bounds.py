"""Oversized input refused before the expensive work (issue 20's abuse kind): token-count lower bounds
from the vocabulary (input_bounds.py) checked against the real tokenizer; prompts and rendered chats over
the context refused without being tokenised; counts refused on the raw JSON before validation
(body_precheck.py); the pre-processing pool's large lane (preprocess_pool.py). The app is the tiny
dummy-weight model (max_model_len 512) with the default model's tokenizer attached: everything here is
refused or answered before the engine would see a token id."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import pytest

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.chat_render import template_keeps_content
from shared_engine.entrypoints.openai.errors import APIError
from shared_engine.entrypoints.openai.input_bounds import TokenBounds
from shared_engine.entrypoints.openai.preprocess_pool import PreprocessPool
from shared_engine.entrypoints.openai.server_config import ServerConfig
from tests.server.app_runner import run_app

LIMITS = ServerConfig(max_chat_messages=3, max_content_parts=3, max_prompts_per_request=3,
                      max_prompt_tokens_per_request=600)
MAX_MODEL_LEN = 512  # the tiny model's max_position_embeddings


class CountingTokenizer:
    """The real tokenizer, counting `encode` calls (what must not happen for a refused request)."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer, self.encoded = tokenizer, 0

    def encode(self, *args, **kwargs):
        self.encoded += 1
        return self._tokenizer.encode(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


@pytest.fixture(scope="module")
def bounds(tokenizer):
    return TokenBounds.from_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def app(tiny_model_dir, tokenizer, bounds):
    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                              num_gpu_blocks_override=64))
    app = create_app(engine, LIMITS)
    ctx = app.state.ctx
    ctx.tokenizer, ctx.bounds = CountingTokenizer(tokenizer), bounds
    ctx.template_keeps_content = template_keeps_content(tokenizer)  # as create_app finds for this tokenizer
    assert ctx.max_model_len == MAX_MODEL_LEN
    return app


ADVERSARIAL = ["word " * 5000, "\n" + " " * 80, " " * 100_000, "\n" * 5000, "<|im_start|>" * 3000, "😀" * 4000,
               "今天天气如何" * 2000, "a" * 50_000, "".join(chr(0x20 + (i * 7919) % 0x2fff) for i in range(40_000)),
               "\u00a0x" * 10_000, "x\u3000" * 10_000, "\t\r\n " * 5000, "aaaa bbbb " * 4000]


def test_bounds_from_the_vocabulary_never_exceed_the_real_count(tokenizer, bounds):
    assert bounds.max_bytes_per_token == 81 and bounds.runs  # "\n" + 80 spaces; byte-level BPE, GPT-2 splits
    for text in ADVERSARIAL:
        for add_special_tokens in (False, True):
            real = len(tokenizer.encode(text, add_special_tokens=add_special_tokens))
            assert bounds.lower_bound(text, full=True)[0] <= real, (text[:20], real)


class _Backend:
    def __init__(self, normalizer) -> None:
        self.normalizer, self.spec = (None if normalizer is None else object()), normalizer

    def to_str(self) -> str:
        return json.dumps({"normalizer": self.spec})

    def get_vocab_size(self, with_added_tokens=True) -> int:
        return 2

    def decode(self, ids, skip_special_tokens=False) -> str:
        return ["ab", "a b"][ids[0]]


@pytest.mark.parametrize("normalizer, safe", [
    (None, True), ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                        {"type": "Replace", "pattern": {"String": " "},
                                                         "content": "\u2581"}]}, True),
    ({"type": "NFKC"}, False), ({"type": "StripAccents"}, False),
    ({"type": "Replace", "pattern": {"Regex": " +"}, "content": " "}, False),
])
def test_no_bounds_when_the_normalizer_may_shrink_text(normalizer, safe):
    tok = type("Tok", (), {"backend_tokenizer": _Backend(normalizer)})()
    got = TokenBounds.from_tokenizer(tok)
    assert got == (TokenBounds(3, runs=False) if safe else TokenBounds())  # "a b" spans two runs
    assert TokenBounds.from_tokenizer(None) == TokenBounds()


def _refused(app, path, body, param, words):
    ctx = app.state.ctx
    before = ctx.tokenizer.encoded

    async def scenario(client):
        start = time.monotonic()
        r = await client.post(path, json=body)
        return r, time.monotonic() - start

    r, seconds = run_app(app, scenario)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and all(w in error["message"] for w in words), error
    return ctx.tokenizer.encoded - before, seconds


CHAT = "/v1/chat/completions"


@pytest.mark.parametrize("path, body, param, words", [
    ("/v1/completions", {"prompt": "word " * 1_000_000, "max_tokens": 1}, "prompt",
     ["maximum context length is 512", "5000000 bytes long", "at least 61729 tokens", "81 bytes"]),
    ("/v1/completions", {"prompt": "ab " * 13_000, "max_tokens": 1}, "prompt", ["13000 whitespace-separated words"]),
    ("/v1/completions", {"prompt": ["ab " * 13_000, "x"], "max_tokens": 1}, "prompt", ["13000 whitespace"]),
    ("/v1/completions", {"prompt": ["a" * 30_000] * 2, "max_tokens": 1}, "prompt",
     ["at least 742 tokens in all", "600 allowed"]),
    (CHAT, {"messages": [{"role": "user", "content": "word " * 1_000_000}], "max_tokens": 1}, "messages",
     ["maximum context length is 512", "bytes long"]),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "ab " * 13_000}]}]}, "messages",
     ["whitespace-separated words"]),
])
def test_input_over_the_context_is_refused_before_tokenising(app, path, body, param, words):
    encoded, seconds = _refused(app, path, body, param, words)
    assert encoded == 0 and seconds < 10, seconds


def test_a_prompt_list_stops_at_the_first_prompt_over_the_context(app):
    body = {"prompt": ["hello " * 600, "hello " * 10, "hello " * 10], "max_tokens": 1}
    words = ["maximum context length is 512", "601 in the prompt"]
    encoded, _ = _refused(app, "/v1/completions", body, "prompt", words)
    assert encoded == 1  # short enough to tokenise exactly; the others never were


@pytest.mark.parametrize("path, body, param, words", [
    # the 4th message has an invalid role: the count is checked before validation looks at it
    (CHAT, {"messages": [{"role": "user", "content": "x"}] * 3 + [{"role": "bogus"}]}, "messages",
     ["at most 3 messages", "got 4"]),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 2},
                         {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": 5}]}]}, "messages",
     ["at most 3 content parts", "got 4"]),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}] * 4}, "messages", ["at most 3 messages"]),
    ("/v1/completions", {"prompt": ["a", "b", "c", {"bad": 1}]}, "prompt", ["at most 3 prompts"]),
    ("/v1/completions", {"prompt": "x", "stop": ["s"] * 17}, "stop", ["at most 16 stop strings"]),
])
def test_counts_are_refused_on_the_raw_body(app, path, body, param, words):
    encoded, _ = _refused(app, path, body, param, words)
    assert encoded == 0


def test_within_the_limits_is_served(app):
    pool = app.state.ctx.pool
    jobs, run = [], pool.run

    async def recording_run(fn, *args, size=0):
        jobs.append((getattr(fn, "__name__", ""), size > pool.large_bytes))
        return await run(fn, *args, size=size)

    async def scenario(client):
        pool.run = recording_run
        try:
            chat = await client.post("/tokenize", json={"messages": [{"role": "user", "content": "Hi there"}] * 3})
            prompt = await client.post("/tokenize", json={"prompt": "word " * 10_000})
            big = await client.post("/tokenize", json={"messages": [{"role": "user", "content": "word " * 60_000}]})
        finally:
            pool.run = run
        return chat, prompt, big

    chat, prompt, big = run_app(app, scenario)
    assert chat.status_code == 200 and chat.json()["count"] > 9
    assert prompt.status_code == 200 and prompt.json()["count"] == 10_001  # /tokenize counts (no context check)
    assert big.status_code == 200 and big.json()["count"] > 60_000, big.text
    # the 300 KB body's chat was rendered in the large lane, the small ones in the small lane
    assert ("render_chat", True) in jobs and ("render_chat", False) in jobs, jobs
    assert ("<lambda>", False) in jobs, jobs  # 50,000 characters: under large_input_bytes


def test_large_inputs_have_their_own_lane_and_a_cap():
    pool = PreprocessPool(small_workers=2, large_bytes=100, max_large=1)
    release = threading.Event()

    async def scenario():
        large = asyncio.ensure_future(pool.run(release.wait, 30, size=101))
        await asyncio.sleep(0.05)
        small = await asyncio.wait_for(pool.run(lambda: "small", size=100), 5)  # never behind the large one
        with pytest.raises(APIError) as refused:
            await pool.run(lambda: "second large", size=10_000)
        release.set()
        return small, await large, refused.value

    small, large, refused = asyncio.run(scenario())
    assert small == "small" and large is True
    assert refused.status == 503 and refused.headers == {"Retry-After": "1"} and "max-large-inputs" in refused.message
    assert pool.large_admitted == 0
    nice = asyncio.run(pool.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), size=101))
    assert nice == os.getpriority(os.PRIO_PROCESS, 0) + 10  # the large lane yields the CPU first


def test_a_chat_over_the_context_is_refused_before_its_template_runs(app):
    pool = app.state.ctx.pool
    jobs, run = [], pool.run

    async def recording_run(fn, *args, size=0):
        jobs.append(getattr(fn, "__name__", ""))
        return await run(fn, *args, size=size)

    async def scenario(client):
        pool.run = recording_run
        try:
            return await client.post(CHAT, json={"messages": [{"role": "system", "content": "x" * 30_000},
                                                              {"role": "user", "content": "y" * 30_000}]})
        finally:
            pool.run = run

    r = run_app(app, scenario)
    assert r.status_code == 400 and "60000 bytes long" in r.json()["error"]["message"], r.text
    assert "render_chat" not in jobs, jobs  # neither rendered nor tokenised


class _DroppingTemplate:
    """A template that leaves system messages out: their text is no lower bound on the rendered prompt."""

    chat_template = "drops system"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages if m["role"] != "system")


def test_the_content_shortcut_needs_a_template_that_keeps_content(tokenizer):
    assert template_keeps_content(tokenizer)  # SmolLM2's ChatML
    assert not template_keeps_content(_DroppingTemplate())
    assert not template_keeps_content(type("NoTemplate", (), {"chat_template": None})())

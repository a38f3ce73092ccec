"""Per-request resource limits (400 naming the field), `max_waiting_requests`' default (503 +
Retry-After), and tokenisation / chat templating off the event loop, on the in-process app with the tiny
dummy-weight model (one app for the module: the limits are checked before anything is queued)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from shared_engine.config import EngineConfig
from shared_engine.engine.engine_snapshot import EngineSnapshot
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.server_config import ServerConfig
from tests.server.app_runner import run_app

PROMPT = [5, 6, 7, 8]
LIMITS = ServerConfig(max_stop_strings=3, max_stop_string_len=8, max_stop_token_ids=2, max_prompts_per_request=3,
                      max_prompt_tokens_per_request=12)


@pytest.fixture(scope="module")
def app(tiny_model_dir):
    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                              num_gpu_blocks_override=64))
    return create_app(engine, LIMITS)


def _ok(**body):
    return {"prompt": PROMPT, "max_tokens": 2, "ignore_eos": True, **body}


@pytest.mark.parametrize("body, param, words", [
    (_ok(stop=["a", "b", "c", "d"]), "stop", "at most 3 stop strings"),
    (_ok(stop="x" * 9), "stop", "at most 8 characters"),
    (_ok(stop_token_ids=[1, 2, 3]), "stop_token_ids", "at most 2 ids"),
    (_ok(prompt=[[5], [6], [7], [8]]), "prompt", "at most 3 prompts"),
    (_ok(prompt=[5] * 13), "prompt", "13 tokens"),
    (_ok(prompt=[[5] * 7, [6] * 6]), "prompt", "13 tokens"),
    (_ok(prompt=[5] * 7, n=2), "prompt", "n=2: 14"),
])
def test_over_a_limit_is_400_naming_the_field(app, body, param, words):
    async def scenario(client):
        r = await client.post("/v1/completions", json=body)
        ok = await client.post("/v1/completions", json=_ok())
        return r, ok

    r, ok = run_app(app, scenario)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert ok.status_code == 200


def test_at_the_limits_is_served(app):
    body = _ok(stop=["a" * 8, "b", "c"], stop_token_ids=[1, 2], prompt=[[5] * 4, [6] * 4, [7] * 4])

    async def scenario(client):
        return await client.post("/v1/completions", json=body)

    r = run_app(app, scenario)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 3


def test_max_waiting_requests_has_a_default_cap(app):
    cap = EngineConfig().scheduler.max_waiting_requests
    assert cap == ServerConfig().max_prompts_per_request * ServerConfig().max_n
    async_engine = app.state.ctx.async_engine
    snapshot = async_engine.snapshot

    async def scenario(client):
        try:
            async_engine.snapshot = lambda: EngineSnapshot(num_waiting=cap - 1)
            below = await client.post("/v1/completions", json=_ok())
            async_engine.snapshot = lambda: EngineSnapshot(num_waiting=cap)
            at = await client.post("/v1/completions", json=_ok())
        finally:
            async_engine.snapshot = snapshot
        return below, at

    below, at = run_app(app, scenario)
    assert below.status_code == 200, below.text
    assert at.status_code == 503 and at.headers["retry-after"] == "1"
    assert f"max_waiting_requests={cap}" in at.json()["error"]["message"]


class _BlockingTokenizer:
    """Encodes and renders chat only once `release` is set: tokenisation and templating that take as long
    as we like."""

    chat_template = "fake"

    def __init__(self) -> None:
        self.entered, self.release, self.returned = threading.Event(), threading.Event(), threading.Event()

    def _block(self) -> None:
        self.entered.set()
        self.release.wait(60)
        self.returned.set()

    def encode(self, text, add_special_tokens=True):
        self._block()
        return PROMPT

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        self._block()  # a chat blocks in its template first: templating is off the loop too, not only encoding
        return "rendered"


@pytest.mark.parametrize("route, body", [
    ("/v1/completions", {"prompt": "x" * 100_000, "max_tokens": 2, "ignore_eos": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}),
    ("/tokenize", {"prompt": "x"}),
])
def test_health_answers_while_a_prompt_is_tokenised(app, route, body):
    """The tokenizer blocks until /health has answered: on the event loop this would never finish."""
    ctx = app.state.ctx
    tokenizer, saved = _BlockingTokenizer(), ctx.tokenizer
    order = []

    async def scenario(client):
        async def big():
            r = await client.post(route, json=body)
            order.append(("big", r.status_code))

        task = asyncio.create_task(big())
        assert await asyncio.to_thread(tokenizer.entered.wait, 60)
        health = await client.get("/health")
        order.append(("health", health.status_code, tokenizer.returned.is_set()))
        tokenizer.release.set()
        await task

    ctx.tokenizer = tokenizer
    try:
        run_app(app, scenario)
    finally:
        ctx.tokenizer = saved
    assert order == [("health", 200, False), ("big", 200)], order

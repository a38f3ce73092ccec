"""Serving with async output processing (`enable_async_output_proc`) and async scheduling
(`async_scheduling`) on the default model, through
`create_app`, with the engine in a thread of this process and in its own engine core process: a streamed
completion that a stop string ends matches the non-streamed one cut at the stop, and no token after the
stop is streamed or counted."""

from __future__ import annotations

import json

import pytest

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.engine_core_client import EngineCoreClient
from tests.server.app_runner import run_app

BODY = {"prompt": "1, 2, 3, 4,", "max_tokens": 10, "temperature": 0, "ignore_eos": True}


async def _stream(client, body) -> tuple[str, list[str | None], int]:
    """The streamed text, the finish reasons seen, and the usage's completion token count."""
    text, reasons, usage = "", [], None
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True,
                             "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200
        lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        event = json.loads(line[6:])
        for choice in event["choices"]:
            text += choice["text"]
            reasons.append(choice["finish_reason"])
        usage = event["usage"]["completion_tokens"] if event.get("usage") else usage
    return text, reasons, usage


@pytest.mark.parametrize("flag", ["enable_async_output_proc", "async_scheduling"])
@pytest.mark.parametrize("where", ["thread", "process"])
def test_stream_with_stop_string(default_model_dir, where, flag):
    config = EngineConfig.from_flat(model=str(default_model_dir), device="cpu", max_model_len=256,
                                    num_gpu_blocks_override=64, **{flag: True})
    app = create_app(LLMEngine(config) if where == "thread" else EngineCoreClient(config))

    async def scenario(client):
        full = (await client.post("/v1/completions", json=BODY)).json()["choices"][0]["text"]
        assert full.startswith(" 5, 6, 7")
        stopped = (await client.post("/v1/completions", json={**BODY, "stop": [" 6"]})).json()
        streamed = await _stream(client, {**BODY, "stop": [" 6"]})
        return full, stopped, streamed

    full, stopped, (text, reasons, usage) = run_app(app, scenario)
    assert stopped["choices"][0]["text"] == text == full[: full.index(" 6")] == " 5,"
    assert stopped["choices"][0]["finish_reason"] == "stop" and reasons[-1] == "stop"
    assert reasons.count("stop") == 1 and not any(reasons[:-1])
    assert usage == stopped["usage"]["completion_tokens"] == 5  # " ", "5", ",", " ", "6": nothing after the stop

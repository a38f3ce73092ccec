"""Liveness with a fault-injected engine: a step that never returns turns /health to 503 and fails the
open streams (error frame, code 503) once the heartbeat is `health_timeout_s` late, in-thread and with the
engine core in its own process (stopped with SIGSTOP, then killed by the server); an internal error outside
a step (a failed command) fails every open stream instead of leaving it waiting. Tiny dummy-weight model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.engine_core_client import EngineCoreClient
from shared_engine.entrypoints.openai.server_config import ServerConfig
from tests.server.app_runner import run_app

PROMPT = [5, 6, 7, 8]
BODY = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}
FAST = ServerConfig(health_timeout_s=3.0)


def _config(tiny_model_dir) -> EngineConfig:
    return EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                  num_gpu_blocks_override=64)


async def _stream(client, body=BODY, started: asyncio.Event | None = None) -> tuple[int, dict | None]:
    """(data frames before the error, the error frame's envelope or None); the stream must end with [DONE].
    `started` is set once the response has begun (the request is in the engine)."""
    frames, error, done = 0, None, False
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        if started is not None:
            started.set()
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    error = event["error"]
                else:
                    frames += 1
    assert done
    return frames, error


async def _health_turns(client, status: int) -> int:
    for _ in range(600):
        r = await client.get("/health")
        if r.status_code == status:
            return r.status_code
        await asyncio.sleep(0.05)
    return r.status_code


def test_hung_step_in_thread(tiny_model_dir):
    engine = LLMEngine(_config(tiny_model_dir))
    release, entered = threading.Event(), threading.Event()
    step = engine.step

    def hung_step():
        entered.set()
        release.wait(120)  # a step that never returns (until the test ends)
        return step()

    app = create_app(engine, FAST)

    async def scenario(client):
        assert (await client.get("/health")).status_code == 200
        engine.step = hung_step
        stream = asyncio.create_task(_stream(client))
        plain = asyncio.create_task(client.post("/v1/completions", json={**BODY, "stream": False}))
        assert await asyncio.to_thread(entered.wait, 60)
        frames, error = await asyncio.wait_for(stream, 120)
        assert frames == 0 and error["code"] == 503 and "no sign of life" in error["message"], error
        r = await asyncio.wait_for(plain, 120)
        assert r.status_code == 503 and "no sign of life" in r.json()["error"]["message"]
        assert await _health_turns(client, 503) == 503
        refused = await client.post("/v1/completions", json={**BODY, "stream": False})
        assert refused.status_code == 503
        release.set()

    try:
        run_app(app, scenario)
    finally:
        release.set()


def test_internal_error_outside_a_step_fails_open_streams(tiny_model_dir):
    """A stream already generating (500 tokens at 20 ms a step) and the stream whose admission fails both
    end with the engine's error frame (code 503) and [DONE]; the first stops short of its 500 tokens."""
    engine = LLMEngine(_config(tiny_model_dir))
    app = create_app(engine)
    add, step = engine.add_request, engine.step
    steps = []

    def slow_step():
        steps.append(len(engine.scheduler.running))
        time.sleep(0.02)
        return step()

    def broken_add(*_args, **_kwargs):
        raise RuntimeError("injected fault while admitting a request")

    async def scenario(client):
        assert (await client.get("/health")).status_code == 200
        engine.step = slow_step
        running = asyncio.create_task(client.post("/v1/completions", json={**BODY, "max_tokens": 500}))
        for _ in range(600):
            if len(steps) >= 10:
                break
            await asyncio.sleep(0.01)
        assert len(steps) >= 10 and steps[-1] == 1, steps  # the first request is generating
        engine.add_request = broken_add
        frames, error = await asyncio.wait_for(_stream(client), 60)
        assert frames == 0 and error["code"] == 503 and "injected fault" in error["message"], error
        r = await asyncio.wait_for(running, 60)
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
        error = events[-1]["error"]  # its stream's last event before [DONE]
        assert error["code"] == 503 and "injected fault" in error["message"], events
        assert len(steps) < 500, len(steps)  # it did not run to its end
        assert await _health_turns(client, 503) == 503

    try:
        run_app(app, scenario)
    finally:
        engine.add_request, engine.step = add, step


def test_hung_engine_core_process(tiny_model_dir):
    core = EngineCoreClient(_config(tiny_model_dir))
    app = create_app(core, FAST)

    async def scenario(client):
        assert (await client.get("/health")).status_code == 200

        os.kill(core.pid, signal.SIGSTOP)  # the core's loop now never comes back (as a hung step)
        frames, error = await asyncio.wait_for(_stream(client), 120)
        assert frames == 0 and error["code"] == 503 and "no sign of life" in error["message"], error
        assert await _health_turns(client, 503) == 503
        for _ in range(200):  # the server kills the stuck core
            if not core._process.is_alive():
                break
            await asyncio.sleep(0.05)
        assert not core._process.is_alive()

    try:
        run_app(app, scenario)
    finally:
        if core._process.is_alive():
            os.kill(core.pid, signal.SIGKILL)

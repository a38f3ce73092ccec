"""The fake engine of `http_path_bench.py`: the engine server's OpenAI chat streaming (real chunk bytes) on a
shared step clock, so every open stream gets its next token in the same tick, as after one engine step.

`fake_engine_app(step_s, chunks)`: a FastAPI app; POST /v1/chat/completions (stream only; `max_tokens` tokens
of " tok", one per tick of `step_s` seconds; usage chunk on `stream_options.include_usage`), GET /health.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


def fake_engine_app(step_s: float, chunks: str = "models"):
    """The engine's OpenAI streaming on a shared step clock (module docstring); `chunks` "models": token
    chunks built as pydantic models and dumped (the server before 2026-12-02), "plain": `ChatContentChunks`."""
    from shared_engine.entrypoints.openai.protocol import ChatChunkChoice, ChatCompletionChunk, DeltaMessage, Usage
    from shared_engine.entrypoints.openai.streaming import DONE, sse

    clock = {"tick": None}

    async def ticker() -> None:
        loop = asyncio.get_running_loop()
        clock["tick"] = loop.create_future()
        while True:
            await asyncio.sleep(step_s)
            done, clock["tick"] = clock["tick"], loop.create_future()
            done.set_result(None)

    @contextlib.asynccontextmanager
    async def lifespan(_):
        task = asyncio.create_task(ticker())
        yield
        task.cancel()

    app = FastAPI(lifespan=lifespan)

    def chunk(rid: str, model: str, created: int, delta: DeltaMessage, finish=None, usage=None) -> str:
        if chunks == "plain" and usage is None and delta.role is None:
            from shared_engine.entrypoints.openai.streaming import ChatContentChunks
            return ChatContentChunks(rid, created, model).content(0, delta.content, finish, None)
        choices = [] if usage is not None else [ChatChunkChoice(index=0, delta=delta, finish_reason=finish)]
        return sse(ChatCompletionChunk(id=rid, created=created, model=model, choices=choices, usage=usage))

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        rid, model, created, n = f"chatcmpl-{random.getrandbits(64):016x}", body.get("model", "m"), int(time.time()), \
            int(body.get("max_tokens") or 16)

        async def events():
            yield chunk(rid, model, created, DeltaMessage(role="assistant", content=""))
            for i in range(n):
                await asyncio.shield(clock["tick"])
                yield chunk(rid, model, created, DeltaMessage(content=" tok"), "length" if i == n - 1 else None)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield chunk(rid, model, created, None, usage=Usage(prompt_tokens=12, completion_tokens=n,
                                                                  total_tokens=12 + n))
            yield DONE

        if not body.get("stream"):
            return JSONResponse({"error": {"message": "stream only", "type": "x", "param": None, "code": 400}}, 400)
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/health")
    async def health():
        return {}

    return app

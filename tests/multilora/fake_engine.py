"""A stand-in for the engine's OpenAI API, for the gateway's tests: it records every body it gets and answers
with the routing fields it saw (`model|tenant|cache_salt`) as the text, so a test reads what reached the engine.

Test-only body fields (the gateway passes unknown fields on): `fake_delay_s` between streamed chunks,
`fake_chunks` (how many), `fake_status` (answer that status with an envelope), `fake_die_after` (break the
stream off after that many chunks)."""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


def create_fake_engine() -> FastAPI:
    app = FastAPI()
    app.state.bodies = []
    app.state.open_streams = 0
    app.state.closed_streams = 0

    def usage(body) -> dict:
        return {"prompt_tokens": 7, "completion_tokens": body.get("fake_chunks", 3), "total_tokens": 0,
                "prompt_tokens_details": {"cached_tokens": 16}}

    async def answer(request: Request, kind: str):
        body = await request.json()
        app.state.bodies.append(body)
        if body.get("fake_status"):
            status = body["fake_status"]
            return JSONResponse({"error": {"message": "fake", "type": "x", "param": None, "code": status}}, status,
                                headers={"Retry-After": "3"} if status == 503 else None)
        text = f"{body['model']}|{body.get('tenant')}|{body.get('cache_salt')}"
        if not body.get("stream"):
            return {"id": "x", "object": kind, "model": body["model"], "choices": [{"index": 0, "text": text,
                    "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                    "usage": usage(body)}

        async def events():
            app.state.open_streams += 1
            try:
                for i in range(body.get("fake_chunks", 3)):
                    if body.get("fake_die_after") == i:
                        raise RuntimeError("engine died")
                    chunk = {"id": "x", "object": "chat.completion.chunk", "model": body["model"],
                             "choices": [{"index": 0, "delta": {"content": text if i == 0 else "."},
                                          "finish_reason": None}], "usage": None}
                    yield f"data: {json.dumps(chunk)}\n\n"
                    await asyncio.sleep(body.get("fake_delay_s", 0))
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield f"data: {json.dumps({'id': 'x', 'choices': [], 'usage': usage(body)})}\n\n"
                yield "data: [DONE]\n\n"
            finally:
                app.state.open_streams -= 1
                app.state.closed_streams += 1

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await answer(request, "chat.completion")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, "text_completion")

    @app.get("/health")
    async def health():
        return {}

    return app

"""The RAG app (FastAPI): `GET /` (the chat page), `GET /health`, `GET /search`, `POST /chat` (SSE).

`POST /chat` with `{"question": "...", "top_k"?, "max_tokens"?, "temperature"?}` retrieves the top chunks,
builds the messages (`prompt.build_messages`: the fixed system prompt, then the excerpts, then the
question), streams the engine's answer and answers with Server-Sent Events, in this order:

    event: sources   data: {"sources": [{"n", "title", "source", "distance"}], "retrieval_ms"}
    event: token     data: {"text": "..."}                                    (one per engine delta)
    event: done      data: {"finish_reason", "usage", "retrieval_ms", "ttft_ms", "e2e_ms",
                            "output_tokens_per_s"}
    event: error     data: {"error": {"message", "type", "code"}}              (instead of done)

`ttft_ms` runs from the request's arrival to the first token event (retrieval included);
`output_tokens_per_s` is the completion tokens after the first over the time after the first token.
A bad request body gets 400 with the OpenAI-style error envelope.
"""

from __future__ import annotations

import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from .engine_client import EngineClient, EngineError, Finished, TextDelta
from .prompt import build_messages, format_excerpt
from .settings import AppSettings
from .system_prompt import load_system_prompt
from .vector_store import RetrievedChunk

logger = logging.getLogger(__name__)
PAGE = Path(__file__).with_name("static") / "index.html"


class ChatRequest(BaseModel):
    question: str = Field(min_length=1, max_length=4000)
    top_k: int | None = Field(default=None, ge=1, le=20)
    max_tokens: int | None = Field(default=None, ge=1, le=4096)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)


@dataclass(frozen=True)
class Source:
    n: int
    title: str
    source: str
    distance: float


def sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


def create_app(settings: AppSettings | None = None, retriever=None) -> FastAPI:
    """The app. `retriever` (anything with `search(question, k)` and `count()`) defaults to one on the
    settings' Chroma collection, opened at startup (loading the embedder takes a few seconds)."""
    settings = settings or AppSettings.from_env()
    system_prompt = load_system_prompt(settings.system_prompt_tokens)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.retriever = retriever or await run_in_threadpool(_open_retriever, settings)
        app.state.engine = EngineClient(settings.engine_url, settings.engine_model, settings.engine_api_key)
        logger.info("RAG app ready: %d chunks, engine %s, system prompt %d chars, %s first",
                    app.state.retriever.count(), settings.engine_url, len(system_prompt),
                    "context" if settings.context_first else "system prompt")
        yield
        await app.state.engine.aclose()

    app = FastAPI(title="RAG chatbot", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"{where}: {first.get('msg', 'invalid request')}")

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text())

    @app.get("/health")
    async def health(request: Request) -> dict:
        return {"status": "ok", "num_chunks": request.app.state.retriever.count(),
                "engine_url": settings.engine_url}

    @app.get("/search")
    async def search(request: Request, q: str, k: int | None = None) -> dict:
        k = min(max(k or settings.top_k, 1), 20)
        chunks = await run_in_threadpool(request.app.state.retriever.search, q, k)
        return {"chunks": [asdict(c) for c in chunks]}

    @app.post("/chat")
    async def chat(body: ChatRequest, request: Request) -> StreamingResponse:
        started = time.perf_counter()
        k = body.top_k or settings.top_k
        chunks: list[RetrievedChunk] = await run_in_threadpool(request.app.state.retriever.search, body.question, k)
        retrieval_ms = (time.perf_counter() - started) * 1000
        excerpts = [format_excerpt(n, c.title, c.source, c.text) for n, c in enumerate(chunks, 1)]
        messages = build_messages(system_prompt, excerpts, body.question, context_first=settings.context_first)
        sources = [Source(n, c.title, c.source, round(c.distance, 4)) for n, c in enumerate(chunks, 1)]
        max_tokens = body.max_tokens or settings.max_tokens
        sampling = {"max_tokens": max_tokens, "temperature": body.temperature,
                    "repetition_penalty": settings.repetition_penalty}
        events = _answer_events(request.app.state.engine, messages, sampling, sources, started, retrieval_ms)
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return app


async def _answer_events(engine: EngineClient, messages, sampling: dict, sources: list[Source], started: float,
                         retrieval_ms: float):
    yield sse("sources", {"sources": [asdict(s) for s in sources], "retrieval_ms": round(retrieval_ms, 1)})
    first = None
    try:
        async for event in engine.stream_chat(messages, **sampling):
            if isinstance(event, TextDelta):
                first = first or time.perf_counter()
                yield sse("token", {"text": event.text})
            elif isinstance(event, Finished):
                yield sse("done", _done(event, started, first, retrieval_ms))
    except EngineError as e:
        logger.warning("engine error %d: %s", e.status, e)
        yield sse("error", {"error": {"message": str(e), "type": "engine_error", "code": e.status}})
    except Exception as e:  # noqa: BLE001 - the stream has started: report in-band, never hang up silently
        logger.exception("chat failed")
        yield sse("error", {"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error", "code": 502}})


def _done(event: Finished, started: float, first: float | None, retrieval_ms: float) -> dict:
    now = time.perf_counter()
    completion = int(event.usage.get("completion_tokens") or 0)
    decode_s = now - first if first else 0.0
    done = {"finish_reason": event.finish_reason, "usage": event.usage, "retrieval_ms": round(retrieval_ms, 1),
            "ttft_ms": round((first - started) * 1000, 1) if first else None,
            "e2e_ms": round((now - started) * 1000, 1),
            "output_tokens_per_s": round((completion - 1) / decode_s, 2) if decode_s > 0 and completion > 1 else None}
    cached = (event.usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    logger.info("chat: retrieval %.0f ms, TTFT %s ms, %s prompt tokens (%s cached), %d output tokens, %s tok/s",
                retrieval_ms, done["ttft_ms"], event.usage.get("prompt_tokens"), cached, completion,
                done["output_tokens_per_s"])
    return done


def _open_retriever(settings: AppSettings):
    from .embedder import Embedder
    from .vector_store import Retriever, connect

    client = connect(settings)
    try:
        return Retriever(client, settings.collection, Embedder())
    except Exception as e:
        raise RuntimeError(f"collection {settings.collection!r} not found in "
                           f"{settings.chroma_url or settings.chroma_dir}: run "
                           "`python -m case_rag_chatbot.app ingest` first") from e

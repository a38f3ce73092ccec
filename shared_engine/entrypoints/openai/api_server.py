"""The FastAPI app (`create_app`) and `run_server` behind `python -m shared_engine serve`.

Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models`, `GET /v1/models/{id}`,
`GET /health`, `GET /metrics`, `POST /tokenize`, `POST /detokenize`, `GET /version`; with LoRA and runtime
updating, `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter` (serving_lora.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

import shared_engine
from shared_engine.config import EngineConfig
from shared_engine.entrypoints.openai.async_engine import AsyncEngine, AsyncEngineBase
from shared_engine.entrypoints.openai.body_precheck import BODY_BYTES_KEY, PrecheckedRoute
from shared_engine.entrypoints.openai.chat_render import render_chat
from shared_engine.entrypoints.openai.engine_watchdog import exit_when_dead
from shared_engine.entrypoints.openai.errors import bad_request, error_response, install_error_handlers
from shared_engine.entrypoints.openai.http_limits import uvicorn_http_options
from shared_engine.entrypoints.openai.metrics import ServerMetrics
from shared_engine.entrypoints.openai.middleware import (
    ApiKeyMiddleware,
    BodySizeLimitMiddleware,
    HeaderCountMiddleware,
)
from shared_engine.entrypoints.openai.openapi import error_responses, install_openapi, stream_responses
from shared_engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    VersionResponse,
)
from shared_engine.entrypoints.openai.server_config import ServerConfig
from shared_engine.entrypoints.openai.serving_base import ServingContext
from shared_engine.entrypoints.openai.serving_chat import ServingChat
from shared_engine.entrypoints.openai.serving_completions import ServingCompletions
from shared_engine.entrypoints.openai.serving_lora import (
    ADMIN_PATHS,
    adapter_cards,
    build_registry,
    install_lora_routes,
)

logger = logging.getLogger("shared_engine.server")


def create_app(engine, server_config: ServerConfig | None = None,
               on_engine_dead: Callable[[], None] | None = None) -> FastAPI:
    """An app serving `engine`: an `LLMEngine` (stepped in a thread of this process, started with the
    app's lifespan) or an `AsyncEngineBase` such as `EngineCoreClient` (the engine core in its own
    process). The app's lifespan starts and shuts down the engine; with `on_engine_dead`, it is called
    once the engine has been dead for `ENGINE_DEAD_GRACE_S` (engine_watchdog.py; `serve` stops the server)."""
    server_config = server_config or ServerConfig()
    async_engine = engine if isinstance(engine, AsyncEngineBase) else AsyncEngine(engine)
    model_name = async_engine.config.model.served_model_name or async_engine.source.name
    metrics = ServerMetrics(async_engine, model_name)
    async_engine.on_step = metrics.on_step
    async_engine.heartbeat.timeout_s = server_config.health_timeout_s
    ctx = ServingContext(async_engine, metrics, model_name, server_config)
    completions, chat = ServingCompletions(ctx), ServingChat(ctx)
    ctx.loras = build_registry(async_engine, model_name, server_config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        async_engine.start(asyncio.get_running_loop())
        watchdog = asyncio.create_task(exit_when_dead(async_engine, on_engine_dead)) if on_engine_dead else None
        yield
        if watchdog is not None:
            watchdog.cancel()
        async_engine.shutdown()

    app = FastAPI(title="shared-engine OpenAI-compatible API", version=shared_engine.__version__,
                  lifespan=lifespan)
    app.state.ctx = ctx
    app.router.route_class = PrecheckedRoute  # counts checked on the raw JSON, before validation
    install_error_handlers(app)

    @app.post("/v1/completions", response_model=CompletionResponse, responses=stream_responses(),
              summary="Create a completion")
    async def create_completion(body: CompletionRequest, request: Request):
        return await completions.create(body, request)

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=stream_responses(),
              summary="Create a chat completion")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request):
        return await chat.create(body, request)

    def model_card() -> ModelCard:
        return ModelCard(id=model_name, root=async_engine.source.name, max_model_len=async_engine.max_model_len,
                         vocab_size=async_engine.source.arch.vocab_size)

    @app.get("/v1/models", response_model=ModelList, responses=error_responses(401), summary="List models")
    async def list_models():
        return ModelList(data=[model_card(), *adapter_cards(ctx.loras, model_name, async_engine.max_model_len)])

    @app.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=error_responses(401, 404),
             summary="Retrieve a model")
    async def retrieve_model(model_id: str):
        if ctx.resolve_model(model_id) is not None:
            return next(c for c in adapter_cards(ctx.loras, model_name, async_engine.max_model_len)
                        if c.id == model_id)
        return model_card()

    @app.get("/health", responses={200: {"content": {"application/json": {}}}, **error_responses(503)},
             summary="200 while the engine runs, 503 after it failed or hung (no heartbeat for health_timeout_s)")
    async def health():
        if not async_engine.healthy:
            return error_response(503, f"the engine is not healthy: {async_engine.error!r}")
        return JSONResponse({})

    @app.get("/metrics", response_class=Response, summary="Prometheus metrics (vLLM names)",
             responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
    async def prometheus_metrics():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/tokenize", response_model=TokenizeResponse, responses=error_responses(400, 401, 404))
    async def tokenize(body: TokenizeRequest, request: Request):
        ctx.check_model(body.model)
        tokenizer = ctx.need_tokenizer()
        if body.messages is not None:
            ids = await ctx.off_loop(render_chat, tokenizer, body.messages, body.add_generation_prompt, body.tools,
                                     size=request.scope.get(BODY_BYTES_KEY, 0))
        elif body.prompt is not None:
            ids = await ctx.off_loop(lambda: tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens),
                                     size=len(body.prompt))
        else:
            raise bad_request("give prompt or messages")
        return TokenizeResponse(count=len(ids), max_model_len=async_engine.max_model_len, tokens=ids)

    @app.post("/detokenize", response_model=DetokenizeResponse, responses=error_responses(400, 401, 404))
    async def detokenize(body: DetokenizeRequest):
        ctx.check_model(body.model)
        vocab = async_engine.source.arch.vocab_size
        if any(t >= vocab for t in body.tokens):
            raise bad_request(f"token ids must be in [0, {vocab})", "tokens")
        return DetokenizeResponse(prompt=await ctx.off_loop(ctx.need_tokenizer().decode, body.tokens,
                                                            size=len(body.tokens)))

    @app.get("/version", response_model=VersionResponse, responses=error_responses(401),
             summary="The engine's version and configuration (local paths reduced to their last component)")
    async def version():
        return VersionResponse(version=shared_engine.__version__,
                               engine_config=without_local_paths(async_engine.config.to_flat()))

    if ctx.loras is not None and server_config.allow_runtime_lora_updating:
        install_lora_routes(app, ctx.loras, server_config.resolved_lora_admin_key())
    install_openapi(app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=server_config.max_request_body_bytes)
    api_key = server_config.resolved_api_key()
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, exempt_paths=server_config.exempt_paths | ADMIN_PATHS)
    app.add_middleware(HeaderCountMiddleware, max_headers=server_config.max_headers)  # outermost: runs first
    return app


def without_local_paths(settings: dict) -> dict:
    """Settings with every value that names a local file or directory (a model or tokenizer path) replaced by
    its last component: /version must not reveal the server's file system."""
    def scrub(value):
        if isinstance(value, str) and (os.path.isabs(value) or value.startswith(("~", "./", "../"))
                                       or os.path.exists(value)):
            return os.path.basename(os.path.normpath(value))
        return value

    return {key: scrub(value) for key, value in settings.items()}


def run_server(engine_config: EngineConfig, server_config: ServerConfig) -> None:
    """Build the engine (logs the KV capacity line), then serve until interrupted, or until the engine
    dies (then exit status 1, engine_watchdog.py). The engine core runs in its own process unless
    `server_config.disable_frontend_multiprocessing`.

    Raises:
        EngineCoreStartError: the engine core process could not build the engine.
    """
    import uvicorn

    if server_config.disable_frontend_multiprocessing:
        from shared_engine.engine.llm_engine import LLMEngine

        engine = LLMEngine(engine_config)
    else:
        from shared_engine.entrypoints.openai.engine_core_client import EngineCoreClient

        engine = EngineCoreClient(engine_config)
    server: uvicorn.Server | None = None

    def stop() -> None:
        server.should_exit = True

    app = create_app(engine, server_config, on_engine_dead=stop)
    host, port = server_config.host, server_config.port
    logger.info("Serving %s on http://%s:%d", app.state.ctx.model_name, host, port)
    server = uvicorn.Server(uvicorn.Config(
        app, host=host, port=port, log_level=server_config.uvicorn_log_level, timeout_graceful_shutdown=5,
        **uvicorn_http_options(server_config.max_header_bytes, server_config.max_headers,
                               limits=server_config.connection_limits)))
    server.run()
    error = app.state.ctx.async_engine.error
    if error is not None:  # the supervisor (compose restart:, Kubernetes) starts a fresh server
        raise SystemExit(f"the engine died ({error}); the server stopped (exit status 1)")

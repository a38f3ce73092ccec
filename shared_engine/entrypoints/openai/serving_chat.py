"""`POST /v1/chat/completions`: messages rendered with the tokenizer's own chat template (chat_render.py),
`response_format` and `tool_choice` enforced by a grammar (structured.py), tool calls parsed
(tool_calls.py), streamed or not."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from shared_engine.entrypoints.openai.body_precheck import BODY_BYTES_KEY
from shared_engine.entrypoints.openai.chat_render import content_text, render_chat
from shared_engine.entrypoints.openai.errors import APIError, bad_request, sse_error
from shared_engine.entrypoints.openai.generation_run import ClientDisconnected, GenerationRun, Job
from shared_engine.entrypoints.openai.logprobs import chat_logprobs, prompt_logprobs
from shared_engine.entrypoints.openai.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    DeltaMessage,
    ResponseMessage,
)
from shared_engine.entrypoints.openai.protocol_tools import DeltaFunctionCall, DeltaToolCall
from shared_engine.entrypoints.openai.request_limits import check_prompt_tokens
from shared_engine.entrypoints.openai.serving_base import ServingContext, event_stream, usage
from shared_engine.entrypoints.openai.streaming import DONE, ChatContentChunks, ChoiceCursor, sse, visible_text
from shared_engine.entrypoints.openai.structured import named_tool, structured_outputs, tool_mode
from shared_engine.entrypoints.openai.tool_calls import calls_from_json, held_back, parse_tool_calls
from shared_engine.outputs import CompletionOutput


class ServingChat:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: ChatCompletionRequest, request: Request) -> Response:
        ctx = self.ctx
        lora = ctx.resolve_model(req.model)
        mode = tool_mode(req)
        tools = req.tools if mode is not None else None
        structured, param = structured_outputs(req, mode)
        await ctx.off_loop(ctx.check_structured, structured, param)  # compiling a schema can take 100s of ms
        k = self._top_logprobs(req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        params = ctx.sampling_params(req, max_tokens, logprobs=k, structured_outputs=structured)
        if req.prompt_logprobs is not None and req.stream:
            raise bad_request("prompt_logprobs is not supported with stream", "prompt_logprobs")
        if ctx.template_keeps_content:  # refused for its size before the template renders it
            ctx.bounds.check_context(content_text(req.messages), ctx.max_model_len, "messages")
        ids = await ctx.off_loop(render_chat, ctx.need_tokenizer(), req.messages, req.add_generation_prompt, tools,
                                 self._check_rendered, size=request.scope.get(BODY_BYTES_KEY, 0))
        check_prompt_tokens(ctx.server_config, [len(ids)], req.n, "messages")
        run = GenerationRun(ctx.async_engine, ctx.metrics, ctx.base_id("chatcmpl", req),
                            [Job(ids, params, cache_salt=ctx.cache_salt(req, request), lora_request=lora,
                                 priority=req.priority, tenant=req.tenant,
                                 session_id=ctx.session_id(req, request))])
        run.start()
        model = ctx.response_model(lora)
        if req.stream:
            return event_stream(self._stream(run, req, request, mode, model))
        try:
            (out,) = await run.results(request)
        except ClientDisconnected:
            return Response(status_code=499)
        choices = [self._choice(c, req, mode, k) for c in out.outputs]
        body = ChatCompletionResponse(id=run.request_ids[0].rsplit("-", 1)[0], model=model,
                                      choices=choices, usage=usage([out]))
        if req.prompt_logprobs is not None and ctx.token_text is not None:
            body.prompt_logprobs = prompt_logprobs(ctx.token_text, out.prompt_token_ids, out.prompt_logprobs,
                                                   req.prompt_logprobs)
        return JSONResponse(body.model_dump(mode="json", exclude_none=False))

    def _check_rendered(self, text: str) -> None:
        """400 before tokenising a rendered chat that surely exceeds the context (input_bounds.py)."""
        self.ctx.bounds.check_context(text, self.ctx.max_model_len, "messages", full=True)

    def _choice(self, c: CompletionOutput, req: ChatCompletionRequest, mode: str | None, k) -> ChatChoice:
        text, calls = visible_text(c), []
        if mode == "auto":
            parsed = parse_tool_calls(text, req.tools, req.parallel_tool_calls is not False)
            text, calls = parsed.content, parsed.tool_calls
        elif mode in ("required", "named"):
            text, calls = None, calls_from_json(text, named_tool(req))
        finish = "tool_calls" if calls and mode != "named" and c.finish_reason == "stop" else c.finish_reason
        return ChatChoice(index=c.index, message=ResponseMessage(content=text, tool_calls=calls),
                          logprobs=self._logprobs(c, k, 0, len(c.token_ids)), finish_reason=finish,
                          stop_reason=c.stop_reason)

    def _top_logprobs(self, req: ChatCompletionRequest) -> int | None:
        if not req.logprobs:
            if req.top_logprobs:
                raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
            return None
        limit = self.ctx.async_engine.config.model.max_logprobs
        if req.top_logprobs is not None and req.top_logprobs > limit:
            raise bad_request(f"top_logprobs must be between 0 and {limit}, got {req.top_logprobs}", "top_logprobs")
        return req.top_logprobs or 0

    def _logprobs(self, c: CompletionOutput, k: int | None, start: int, end: int) -> ChatLogprobs | None:
        if k is None or self.ctx.token_text is None:
            return None
        entries = (c.logprobs or [])[start:end]
        return ChatLogprobs(content=chat_logprobs(self.ctx.token_text, c.token_ids[start:end], entries, k))

    async def _stream(self, run: GenerationRun, req: ChatCompletionRequest, request: Request, mode: str | None,
                      model: str):
        base_id, created = run.request_ids[0].rsplit("-", 1)[0], int(time.time())
        k = self._top_logprobs(req)

        def chunk(choices, usage_=None):
            return sse(ChatCompletionChunk(id=base_id, created=created, model=model, choices=choices,
                                           usage=usage_))

        yield chunk([ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content=""))
                     for i in range(req.n)])
        cursors: dict[int, ChoiceCursor] = {}
        tools: dict[int, _ToolStream] = {}
        plain = ChatContentChunks(base_id, created, model) if mode is None and k is None else None
        final = None
        async with run.abort_on_disconnect(request):
            try:
                async for _, out in run.outputs():
                    final = out
                    for c in out.outputs:
                        delta = cursors.setdefault(c.index, ChoiceCursor()).advance(c)
                        if delta is None:
                            continue
                        message, finish = delta.text or None, delta.finish_reason
                        if plain is not None:  # no tools, no logprobs: the chunk without the models
                            yield plain.content(c.index, message, finish, c.stop_reason if finish else None)
                            continue
                        message = DeltaMessage(content=message)
                        if mode is not None:
                            stream = tools.setdefault(c.index, _ToolStream(req, mode))
                            message = stream.advance(delta.text, finish is not None)
                            if stream.called and finish == "stop" and mode != "named":
                                finish = "tool_calls"
                        yield chunk([ChatChunkChoice(
                            index=c.index, delta=message, finish_reason=finish,
                            logprobs=self._logprobs(c, k, delta.token_start, delta.token_end),
                            stop_reason=c.stop_reason if delta.finish_reason else None)])
            except ClientDisconnected:
                return
            except APIError as e:
                yield sse_error(e)
                yield DONE
                return
        if req.stream_options is not None and req.stream_options.include_usage and final is not None:
            yield chunk([], usage([final]))
        yield DONE


class _ToolStream:
    """One choice's deltas when tools are in play: `auto` streams the content before the first
    `<tool_call>` (holding back a tail that may become one); the calls, each with its whole arguments,
    come in the last delta. `required` / named stream no content, only the calls at the end."""

    def __init__(self, req: ChatCompletionRequest, mode: str) -> None:
        self.req, self.mode = req, mode
        self.text, self.sent = "", 0
        self.called = False

    def advance(self, text: str, finished: bool) -> DeltaMessage:
        self.text += text
        if not finished:
            if self.mode != "auto":
                return DeltaMessage()
            safe = len(self.text) - held_back(self.text)
            piece, self.sent = self.text[self.sent:safe], max(self.sent, safe)
            return DeltaMessage(content=piece or None)
        if self.mode == "auto":
            parsed = parse_tool_calls(self.text, self.req.tools, self.req.parallel_tool_calls is not False)
            content, calls = parsed.content or "", parsed.tool_calls
            rest = content[self.sent:] if content.startswith(self.text[:self.sent]) else ""
        else:
            rest, calls = "", calls_from_json(self.text, named_tool(self.req))
        self.called = bool(calls)
        deltas = [DeltaToolCall(index=i, id=c.id, type="function",
                                function=DeltaFunctionCall(name=c.function.name, arguments=c.function.arguments))
                  for i, c in enumerate(calls)]
        return DeltaMessage(content=rest or None, tool_calls=deltas or None)

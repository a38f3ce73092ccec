"""`POST /v1/completions`: prompts (text, texts, token ids or lists of them) → choices, streamed or not.

`echo` with `max_tokens` 0 scores the prompt: the engine runs one step for the prompt logprobs and the
sampled token is dropped (`completion_tokens` 0). With `echo` and `logprobs` k, prompt positions carry
their top k as generated ones do. `suffix` (insertion) and `best_of` > n (server-side ranking) are not
served: a 400 names them.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from shared_engine.engine.request_validator import context_overflow
from shared_engine.entrypoints.openai.errors import APIError, bad_request, sse_error
from shared_engine.entrypoints.openai.generation_run import ClientDisconnected, GenerationRun, Job
from shared_engine.entrypoints.openai.input_bounds import EXACT_BELOW_BYTES
from shared_engine.entrypoints.openai.logprobs import completion_logprobs, prompt_logprobs
from shared_engine.entrypoints.openai.protocol import CompletionChoice, CompletionRequest, CompletionResponse
from shared_engine.entrypoints.openai.request_limits import check_prompt_count, check_prompt_tokens
from shared_engine.entrypoints.openai.serving_base import ServingContext, event_stream, usage
from shared_engine.entrypoints.openai.streaming import DONE, ChoiceCursor, sse, visible_text
from shared_engine.outputs import CompletionOutput, RequestOutput


class ServingCompletions:
    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx

    async def create(self, req: CompletionRequest, request: Request) -> Response:
        ctx = self.ctx
        lora = ctx.resolve_model(req.model)
        self._check_unsupported(req)
        scoring = req.max_tokens == 0
        if scoring and not req.echo:
            raise bad_request("max_tokens must be at least 1 (0 is allowed only with echo)", "max_tokens")
        params = ctx.sampling_params(req, 1 if scoring else req.max_tokens, logprobs=req.logprobs,
                                     prompt_logprobs=req.logprobs if req.echo else None)
        prompts = await self._prompts(req.prompt, req.n, params.max_tokens)
        check_prompt_tokens(ctx.server_config, [len(ids) for _, ids in prompts], req.n, "prompt")
        salt = ctx.cache_salt(req, request)
        session = ctx.session_id(req, request)
        run = GenerationRun(ctx.async_engine, ctx.metrics, ctx.base_id("cmpl", req),
                            [Job(ids, params, text, salt, lora, req.priority, req.tenant, session)
                             for text, ids in prompts])
        run.start()
        model = ctx.response_model(lora)
        if req.stream:
            return event_stream(self._stream(run, req, prompts, scoring, request, model))
        try:
            outputs = await run.results(request)
        except ClientDisconnected:
            return Response(status_code=499)
        choices = [self._choice(pi * req.n + c.index, prompts[pi], out, c, req, scoring, echo=req.echo)
                   for pi, out in enumerate(outputs) for c in out.outputs]
        body = CompletionResponse(id=run.request_ids[0].rsplit("-", 1)[0], model=model,
                                  choices=choices, usage=usage(outputs, count_generated=not scoring))
        return JSONResponse(body.model_dump(mode="json"))

    def _check_unsupported(self, req: CompletionRequest) -> None:
        if req.suffix:
            raise bad_request("suffix (insertion) is not supported", "suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise bad_request(f"best_of must equal n ({req.n}): choices are not ranked server-side", "best_of")
        limit = self.ctx.async_engine.config.model.max_logprobs
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(req, name)
            if value is not None and value > limit:
                raise bad_request(f"{name} must be between 0 and {limit}, got {value}", name)
        if req.prompt_logprobs is not None and req.stream:
            raise bad_request("prompt_logprobs is not supported with stream", "prompt_logprobs")

    async def _prompts(self, prompt, n: int, max_tokens: int | None) -> list[tuple[str | None, list[int]]]:
        """(text or None, token ids) per prompt. Counts and size bounds are checked before anything is
        tokenised, each text is tokenised off the event loop, and a list stops at the first prompt over the
        context (the rest are not tokenised)."""
        ctx = self.ctx
        if isinstance(prompt, str):
            return [(prompt, await ctx.encode(prompt) if prompt else [])]
        if not prompt:
            raise bad_request("prompt must not be empty", "prompt")
        if isinstance(prompt[0], int):
            return [(None, list(prompt))]
        check_prompt_count(ctx.server_config, len(prompt))
        if not isinstance(prompt[0], str):
            return [(None, list(p)) for p in prompt]
        self._check_budget(prompt, n)
        out = []
        for text in prompt:
            ids = await ctx.encode(text, size=sum(map(len, prompt))) if text else []
            message = context_overflow(len(ids), max_tokens, ctx.max_model_len)
            if message is not None:
                raise bad_request(message, "prompt")
            out.append((text, ids))
        return out

    def _check_budget(self, texts: list[str], n: int) -> None:
        """400 when long prompts surely exceed `max_prompt_tokens_per_request` (input_bounds.py), before
        any is tokenised (shorter ones are counted exactly after tokenising)."""
        if sum(map(len, texts)) < EXACT_BELOW_BYTES:
            return
        budget = self.ctx.server_config.max_prompt_tokens_per_request
        least = sum(self.ctx.bounds.lower_bound(t)[0] for t in texts)
        if least * n > budget:
            raise bad_request(f"prompt: the request's prompts have at least {least} tokens in all (x n={n}: "
                              f"{least * n}), more than the {budget} allowed per request", "prompt")

    def _prompt_text(self, prompt: tuple[str | None, list[int]]) -> str:
        text, ids = prompt
        if text is not None:
            return text
        tokenizer = self.ctx.tokenizer
        return tokenizer.decode(ids) if tokenizer is not None else ""

    def _choice(self, index: int, prompt: tuple[str | None, list[int]], out: RequestOutput,
                c: CompletionOutput, req: CompletionRequest, scoring: bool, echo: bool,
                token_range: tuple[int, int] | None = None, text: str | None = None,
                offset: int = 0) -> CompletionChoice:
        """A whole choice, or (streaming) the part given by `text` and `token_range`, whose first token's
        `text_offset` is `offset`."""
        start, end = token_range or (0, len(c.token_ids))
        if scoring:
            start = end = 0
        text = ("" if scoring else visible_text(c)) if text is None else ("" if scoring else text)
        ids = list(c.token_ids[start:end])
        entries = list((c.logprobs or [])[start:end])
        if echo:
            text = self._prompt_text(prompt) + text
            prompt_ids = prompt[1]
            ids = prompt_ids + ids
            entries = list(out.prompt_logprobs or [None] * len(prompt_ids)) + entries
        logprobs = None
        if req.logprobs is not None and self.ctx.token_text is not None:
            logprobs = completion_logprobs(self.ctx.token_text, ids, entries, req.logprobs, offset)
        finish = c.finish_reason
        if scoring and finish is not None:
            finish = "length"
        choice = CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish,
                                  stop_reason=None if scoring else c.stop_reason)
        if req.prompt_logprobs is not None and self.ctx.token_text is not None:
            choice.prompt_logprobs = prompt_logprobs(self.ctx.token_text, prompt[1], out.prompt_logprobs,
                                                     req.prompt_logprobs)
        return choice

    async def _stream(self, run: GenerationRun, req: CompletionRequest, prompts, scoring: bool,
                      request: Request, model: str):
        base_id, created = run.request_ids[0].rsplit("-", 1)[0], int(time.time())
        cursors: dict[tuple[int, int], ChoiceCursor] = {}
        offsets: dict[tuple[int, int], int] = {}  # text_offset of each choice's next token
        finals: dict[int, RequestOutput] = {}
        async with run.abort_on_disconnect(request):
            try:
                async for pi, out in run.outputs():
                    finals[pi] = out
                    for c in out.outputs:
                        cursor = cursors.setdefault((pi, c.index), ChoiceCursor())
                        first = cursor.sent_tokens == 0 and cursor.sent_chars == 0
                        delta = cursor.advance(c)
                        if delta is None:
                            continue
                        choice = self._choice(pi * req.n + c.index, prompts[pi], out, c, req, scoring,
                                              echo=bool(req.echo) and first,
                                              token_range=(delta.token_start, delta.token_end),
                                              text=delta.text, offset=offsets.get((pi, c.index), 0))
                        if choice.logprobs is not None and choice.logprobs.tokens:
                            offsets[(pi, c.index)] = choice.logprobs.text_offset[-1] + len(choice.logprobs.tokens[-1])
                        yield sse(CompletionResponse(id=base_id, created=created, model=model,
                                                     choices=[choice]))
            except ClientDisconnected:
                return
            except APIError as e:
                yield sse_error(e)
                yield DONE
                return
        if req.stream_options is not None and req.stream_options.include_usage:
            outputs = [finals[i] for i in sorted(finals)]
            yield sse(CompletionResponse(id=base_id, created=created, model=model, choices=[],
                                         usage=usage(outputs, count_generated=not scoring)))
        yield DONE

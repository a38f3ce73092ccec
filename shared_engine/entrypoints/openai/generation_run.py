"""`GenerationRun`: the engine requests behind one HTTP request (one per prompt), their shared output
queue, their metrics, and their abort when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request

from shared_engine.entrypoints.openai.async_engine import (
    AsyncEngineBase,
    DuplicateRequestError,
    EngineDeadError,
    OverloadedError,
)
from shared_engine.entrypoints.openai.errors import APIError, bad_request, overloaded
from shared_engine.entrypoints.openai.metrics import RequestTracker, ServerMetrics
from shared_engine.outputs import RequestOutput
from shared_engine.sampling_params import SamplingParams


@dataclass
class Job:
    prompt_token_ids: list[int]
    params: SamplingParams
    prompt: str | None = None
    cache_salt: str | None = None  # requests share cached prefix blocks only under the same salt
    lora_request: object | None = None  # LoRARequest: the adapter the request's `model` named
    priority: int = 0  # the scheduling policy's inputs (LLMEngine.add_request)
    tenant: str | None = None
    session_id: str | None = None  # its finished turn's prefix is pinned (--session-pin-ttl)


class ClientDisconnected(Exception):
    pass


async def wait_disconnect(request: Request) -> None:
    """Return when the client closes the connection (the body has been read by then)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class GenerationRun:
    def __init__(self, async_engine: AsyncEngineBase, metrics: ServerMetrics, base_id: str,
                 jobs: list[Job]) -> None:
        self.engine = async_engine
        self.jobs = jobs
        self.request_ids = [f"{base_id}-{i}" for i in range(len(jobs))]
        self.trackers: dict[str, RequestTracker] = {rid: metrics.tracker() for rid in self.request_ids}
        self.queue: asyncio.Queue = asyncio.Queue()
        self._open: set[str] = set()

    def start(self) -> None:
        """Validate every job, then queue them all (nothing is queued when one is invalid).

        Raises:
            APIError: 400 for an invalid job, 503 when overloaded or the engine is down.
        """
        try:
            for job in self.jobs:
                self.engine.check_request(job.prompt_token_ids, job.params)
            for rid, job in zip(self.request_ids, self.jobs):
                self.engine.add_request(rid, job.prompt_token_ids, job.params, job.prompt, stream=self.queue,
                                        cache_salt=job.cache_salt, lora_request=job.lora_request,
                                        priority=job.priority, tenant=job.tenant,
                                        session_id=job.session_id)
                self._open.add(rid)
        except DuplicateRequestError as e:
            self.abort()
            raise bad_request(str(e), "request_id") from e
        except ValueError as e:
            self.abort()
            raise bad_request(str(e)) from e
        except OverloadedError as e:
            self.abort()
            raise overloaded(f"the server is overloaded: {e}; retry later") from e
        except EngineDeadError as e:
            self.abort()
            raise APIError(503, f"the engine is not healthy: {e}") from e

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, output) until every request finished.

        Raises:
            APIError: 503 when the engine failed (dead or hung), 400 when it rejected a request.
            ClientDisconnected: a request was aborted.
        """
        while self._open:
            rid, item = await self.queue.get()
            if item is None:
                raise ClientDisconnected()
            if isinstance(item, EngineDeadError):
                raise APIError(503, str(item))
            if isinstance(item, BaseException):
                raise bad_request(str(item))
            self.trackers[rid].on_output(item)
            if item.finished:
                self._open.discard(rid)
                self.trackers[rid].finish()
            yield self.request_ids.index(rid), item

    async def results(self, request: Request) -> list[RequestOutput]:
        """Run to completion (non-streaming); aborts everything when the client disconnects first."""
        final: list[RequestOutput | None] = [None] * len(self.jobs)

        async def collect():
            async for index, output in self.outputs():
                final[index] = output

        work = asyncio.ensure_future(collect())
        watcher = asyncio.ensure_future(wait_disconnect(request))
        try:
            await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                raise ClientDisconnected()
            work.result()
        finally:
            for task in (work, watcher):
                task.cancel()
            self.abort()
        return final

    def abort(self) -> None:
        """Abort whatever has not finished (idempotent)."""
        for rid in list(self._open):
            self.engine.abort(rid)
            self.trackers[rid].finish(aborted=True)
        self._open.clear()

    @contextlib.asynccontextmanager
    async def abort_on_disconnect(self, request: Request):
        """While streaming: abort as soon as the client disconnects, not at the next failed send."""
        watcher = asyncio.ensure_future(wait_disconnect(request))
        watcher.add_done_callback(lambda t: None if t.cancelled() else self.abort())
        try:
            yield
        finally:
            watcher.cancel()
            self.abort()

"""The server's view of the engine: requests in, `RequestOutput`s out, on the asyncio event loop.

`AsyncEngineBase` routes each request's outputs to its `asyncio.Queue`, validates and queues requests,
refuses them when overloaded or dead, and aborts requests whose consumer went away. Two transports:
- `AsyncEngine` (this file): `LLMEngine.step()` in a thread beside the event loop, sharing its GIL
  (`--disable-frontend-multiprocessing`, and what `create_app(LLMEngine)` builds, e.g. in tests);
- `EngineCoreClient` (engine_core_client.py): the engine core in its own process (the `serve` default).
Requests and aborts reach the engine before its next step, so an abort frees its KV blocks then. If a
step (or anything else in the engine loop) raises, or the loop gives no heartbeat for `health_timeout_s`
(a step that never returns, heartbeat.py), the engine is dead: every in-flight request gets
`EngineDeadError` (503), `healthy` turns False, and new requests are refused.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable

from shared_engine.engine.engine_snapshot import EngineSnapshot
from shared_engine.engine.request_validator import validate_request
from shared_engine.entrypoints.openai.heartbeat import Heartbeat
from shared_engine.outputs import RequestOutput
from shared_engine.sampling_params import SamplingParams

logger = logging.getLogger("shared_engine.server")

_IDLE_WAIT_S = 0.5


class EngineDeadError(RuntimeError):
    """The engine loop failed; the request cannot complete."""


class DuplicateRequestError(ValueError):
    """A request id that a running request already has."""


class OverloadedError(RuntimeError):
    """More requests are waiting than `max_waiting_requests` allows."""


class AsyncEngineBase(ABC):
    """Subclasses set `config`, `source`, `max_model_len`, `tokenizer` and implement the transport:
    `start`, `shutdown`, `healthy`, `snapshot`, `_num_in_transit`, `_submit_add`, `_submit_abort`.
    `on_step(num_tokens)`, if set, is called after every engine step (from any thread). The transport beats
    `heartbeat` whenever the engine loop shows a sign of life and calls `_watch(loop)` in `start`."""

    config = source = tokenizer = None
    max_model_len: int = 0

    def __init__(self, on_step: Callable[[int], None] | None = None) -> None:
        self.on_step = on_step
        self.error: BaseException | None = None
        self._streams: dict[str, asyncio.Queue] = {}  # touched on the event loop only
        self._loop: asyncio.AbstractEventLoop | None = None
        self.heartbeat = Heartbeat()

    # ---- transport (subclasses) ----------------------------------------------------------------------
    @abstractmethod
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        ...

    @abstractmethod
    def shutdown(self) -> None:
        ...

    @property
    @abstractmethod
    def healthy(self) -> bool:
        ...

    @abstractmethod
    def snapshot(self) -> EngineSnapshot:
        ...

    @abstractmethod
    def _num_in_transit(self) -> int:
        """Requests queued for the engine that it has not admitted yet."""
        ...

    @abstractmethod
    def _submit_add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None, cache_salt: str | None = None, lora_request=None,
                    scheduling: dict | None = None) -> None:
        ...

    @abstractmethod
    def _submit_abort(self, request_id: str) -> None:
        ...

    # ---- requests (event loop side) ------------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return self.snapshot().num_waiting + self._num_in_transit()

    def check_request(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Raise `ValueError` (a 400) for what the engine would reject, before anything is queued."""
        validate_request(prompt_token_ids, params, self.max_model_len, self.config.model.max_logprobs,
                         self.source.arch.vocab_size)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None = None, stream: asyncio.Queue | None = None,
                    cache_salt: str | None = None, lora_request=None, priority: int = 0,
                    tenant: str | None = None, session_id: str | None = None) -> asyncio.Queue:
        """Queue a request. Its events arrive on `stream` (a new queue unless given; several requests
        may share one) as `(request_id, item)`: item is a `RequestOutput`, None (aborted) or an
        exception (the request failed); a finished output, None or an exception is the last one.
        `lora_request` (a `LoRARequest`) runs it on that adapter; `priority` and `tenant` go to the
        scheduling policy and `session_id` to session pinning (`LLMEngine.add_request`).

        Raises:
            EngineDeadError, OverloadedError, ValueError (invalid request, or `request_id` in use).
        """
        if not self.healthy:
            raise EngineDeadError("the engine is not running")
        cap = self.config.scheduler.max_waiting_requests
        if cap is not None and self.num_waiting >= cap:
            raise OverloadedError(f"{self.num_waiting} requests are waiting (max_waiting_requests={cap})")
        self.check_request(prompt_token_ids, params)
        if request_id in self._streams:
            raise DuplicateRequestError(f"request id {request_id!r} is already in use by a running request")
        stream = asyncio.Queue() if stream is None else stream
        self._streams[request_id] = stream
        self._submit_add(request_id, prompt_token_ids, params, prompt, cache_salt, lora_request,
                         {"priority": priority, "tenant": tenant, "session_id": session_id})
        return stream

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       prompt: str | None = None) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs until it finishes; aborts it when the consumer stops early."""
        stream = self.add_request(request_id, prompt_token_ids, params, prompt)
        try:
            while True:
                _, item = await stream.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return
        finally:
            self.abort(request_id)

    def abort(self, request_id: str) -> None:
        """Abort a request (idempotent); the engine frees its blocks before its next step."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return
        stream.put_nowait((request_id, None))
        self._submit_abort(request_id)

    # ---- back on the event loop ----------------------------------------------------------------------
    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            stream.put_nowait((output.request_id, output))
            if output.finished:
                del self._streams[output.request_id]

    def _deliver_error(self, request_id: str, exc: BaseException) -> None:
        stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put_nowait((request_id, exc))

    def _fail_all(self, exc: BaseException) -> None:
        error = exc if isinstance(exc, EngineDeadError) else EngineDeadError(
            f"the engine failed: {type(exc).__name__}: {exc}")
        for request_id, stream in self._streams.items():
            stream.put_nowait((request_id, error))
        self._streams.clear()

    # ---- liveness (on the event loop) ----------------------------------------------------------------
    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        self.heartbeat.watch(loop, self._on_stall)

    def _on_stall(self, silent_s: float) -> None:
        if self.error is not None:
            return
        self.error = EngineDeadError(
            f"the engine loop gave no sign of life for {silent_s:.1f} s (health_timeout_s="
            f"{self.heartbeat.timeout_s:g}): a step that does not return")
        logger.error("%s; failing in-flight requests", self.error)
        self._fail_all(self.error)
        self._on_hung()

    def _on_hung(self) -> None:
        """The transport's reaction to a stuck engine loop (the engine core process is killed); none here."""
        return None


class AsyncEngine(AsyncEngineBase):
    """`LLMEngine.step()` in a dedicated thread beside the event loop (one process, one GIL)."""

    def __init__(self, engine, on_step: Callable[[int], None] | None = None) -> None:
        super().__init__(on_step)
        self.engine = engine
        self.config, self.source, self.tokenizer = engine.config, engine.source, engine.tokenizer
        self.max_model_len = engine.max_model_len
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._num_queued_adds = 0
        self._count_lock = threading.Lock()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._last_tokens = 0

    # ---- lifecycle -----------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        # The engine thread and the event loop share the GIL. With CPython's default 5 ms switch interval
        # the engine thread, back from a GPU wait while the loop streams responses, can wait up to 5 ms
        # for the GIL, more than once per step; 1 ms bounds that wait (at some switching cost).
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))
        self._loop = loop
        self._stop = False  # a shut-down engine can be started again (one app served by several loops)
        add_failure_callback = getattr(self.engine.runner, "add_failure_callback", None)  # tensor parallelism
        if add_failure_callback is not None:
            add_failure_callback(self._on_worker_failure)
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()
        self._watch(loop)

    def shutdown(self) -> None:
        self.heartbeat.stop()
        self._stop = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread is not None and self._thread.is_alive()

    def _on_worker_failure(self, reason: str) -> None:
        """A tensor-parallel worker died (its monitor's thread): fail everyone now, even while idle."""
        self.error = EngineDeadError(reason)
        self._loop.call_soon_threadsafe(self._fail_all, self.error)

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot.of(self.engine)

    def _num_in_transit(self) -> int:
        return self._num_queued_adds

    def _submit_add(self, request_id, prompt_token_ids, params, prompt, cache_salt=None, lora_request=None,
                    scheduling=None) -> None:
        with self._count_lock:
            self._num_queued_adds += 1
        self._commands.put(("add", request_id, prompt_token_ids, params, prompt, cache_salt, lora_request,
                            scheduling or {}))
        self._wakeup.set()

    def _submit_abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._wakeup.set()

    # ---- engine thread -------------------------------------------------------------------------------
    def _run(self) -> None:
        """The engine loop. Any exception here (a step, a command, a metrics hook) kills the engine and fails
        every open stream: a client must never wait on a loop that has stopped."""
        try:
            self._loop_forever()
        except BaseException as exc:  # noqa: BLE001 - any failure kills the engine, not the server
            logger.exception("engine loop failed; failing in-flight requests")
            self.error = exc
            self._loop.call_soon_threadsafe(self._fail_all, exc)

    def _loop_forever(self) -> None:
        engine = self.engine
        while not self._stop and self.error is None:  # declared dead (hung, a worker failed): stop
            self.heartbeat.beat()
            self._wakeup.clear()
            self._drain_commands()
            if not engine.has_unfinished_requests():
                self._wakeup.wait(_IDLE_WAIT_S)
                continue
            outputs = engine.step()
            if self.on_step is not None:
                total = engine.stats.num_prompt_tokens_total + engine.stats.num_generation_tokens_total
                self.on_step(total - self._last_tokens)
                self._last_tokens = total
            if outputs:
                self._loop.call_soon_threadsafe(self._deliver, outputs)

    def _drain_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, request_id, ids, params, prompt, cache_salt, lora_request, scheduling = command
                try:
                    self.engine.add_request(request_id, ids, params, prompt=prompt, cache_salt=cache_salt,
                                            lora_request=lora_request, **scheduling)
                except ValueError as exc:
                    self._loop.call_soon_threadsafe(self._deliver_error, request_id, exc)
                finally:
                    with self._count_lock:
                        self._num_queued_adds -= 1
            else:
                self.engine.abort_request(command[1])

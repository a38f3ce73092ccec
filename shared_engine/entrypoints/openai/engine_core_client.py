"""`EngineCoreClient`: the server's engine, running in its own process (shared_engine/engine/core_process.py).

The API process keeps the tokenizer (chat templates, /tokenize), validation and the per-request streams;
the engine core process schedules, runs the model and detokenises. A reader thread receives one message
per engine step and hands it to the event loop, which rebuilds each request's cumulative `RequestOutput`
from its delta (output_delta.py). The core is started with `multiprocessing`'s spawn method (CUDA cannot
be used in a forked child).

Failure handling: a step that raises in the core, the core process dying (killed, out of memory), or the
core falling silent for `health_timeout_s` (a step that never returns; the core is then killed) marks the
engine dead: every in-flight request gets `EngineDeadError` (503), `/health` answers 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import threading
from collections.abc import Callable

from shared_engine.config import EngineConfig
from shared_engine.engine.core_process import EngineInfo, run_engine_core
from shared_engine.engine.engine_snapshot import EngineSnapshot
from shared_engine.engine.output_delta import OutputDeltaDecoder
from shared_engine.engine.tokenizer import load_tokenizer
from shared_engine.entrypoints.openai.async_engine import AsyncEngineBase, EngineDeadError
from shared_engine.sampling_params import SamplingParams

logger = logging.getLogger("shared_engine.server")

SHUTDOWN_TIMEOUT_S = 10.0


class EngineCoreStartError(RuntimeError):
    """The engine core process could not build the engine (bad model, config, out of memory)."""


class EngineCoreClient(AsyncEngineBase):
    """Builds the engine in a new process; blocks until it is ready (model loaded, graphs captured).

    Raises:
        EngineCoreStartError: the engine core failed to start (its log has the traceback).
    """

    def __init__(self, config: EngineConfig, on_step: Callable[[int], None] | None = None) -> None:
        super().__init__(on_step)
        ctx = multiprocessing.get_context("spawn")
        self._results, child_results = ctx.Pipe(duplex=False)
        child_commands, self._commands = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=run_engine_core, name="EngineCore", daemon=True,
                                    args=(config, child_commands, child_results, logging.getLogger().level))
        self._process.start()
        child_results.close()
        child_commands.close()
        try:
            message = self._results.recv()
        except EOFError:
            self._process.join(5)
            message = ("failed", f"the engine core process exited (exit code {self._process.exitcode})")
        if message[0] != "ready":
            self._process.join(SHUTDOWN_TIMEOUT_S)
            raise EngineCoreStartError(message[1])
        info: EngineInfo = message[1]
        self.config, self.source, self.max_model_len = info.config, info.source, info.max_model_len
        self.tokenizer = load_tokenizer(self.source.tokenizer_path)
        self._decoder = OutputDeltaDecoder()
        self._snapshot = EngineSnapshot()
        self._num_adds_sent = 0
        self._num_adds_seen = 0
        self._reader: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._closing = False

    # ---- lifecycle -----------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._reader = threading.Thread(target=self._read, name="engine-core-reader", daemon=True)
        self._reader.start()
        self._watch(loop)

    def shutdown(self) -> None:
        self.heartbeat.stop()
        self._closing = True
        with contextlib.suppress(OSError):  # the core is already gone
            self._send(("shutdown",))
        self._process.join(SHUTDOWN_TIMEOUT_S)
        if self._process.is_alive():
            logger.warning("engine core did not stop in %.0f s; terminating it", SHUTDOWN_TIMEOUT_S)
            self._process.terminate()
            self._process.join(5)
        self._commands.close()

    @property
    def healthy(self) -> bool:
        return self.error is None and self._process.is_alive()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def snapshot(self) -> EngineSnapshot:
        return self._snapshot

    def _num_in_transit(self) -> int:
        return self._num_adds_sent - self._num_adds_seen

    # ---- to the engine core --------------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self._commands.send(message)

    def _submit_add(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None, cache_salt: str | None = None, lora_request=None,
                    scheduling: dict | None = None) -> None:
        self._decoder.register(request_id, prompt, prompt_token_ids)
        self._num_adds_sent += 1
        try:
            self._send(("add", request_id, prompt_token_ids, params, prompt, cache_salt, lora_request,
                        scheduling or {}))
        except OSError as exc:
            self._streams.pop(request_id, None)
            self._decoder.forget(request_id)
            raise EngineDeadError(f"the engine core is gone: {exc}") from exc

    def _submit_abort(self, request_id: str) -> None:
        self._decoder.forget(request_id)
        with contextlib.suppress(OSError):  # the core is gone: nothing left to free
            self._send(("abort", request_id))

    # ---- from the engine core (reader thread, then the event loop) -----------------------------------
    def _read(self) -> None:
        while True:
            try:
                message = self._results.recv()
            except (EOFError, OSError):
                if not self._closing:
                    self._process.join(1)
                    reason = f"the engine core process exited (exit code {self._process.exitcode})"
                    self._loop.call_soon_threadsafe(self._on_dead, reason)
                return
            self.heartbeat.beat()  # every message is a sign of life, "heartbeat" ones while idle
            self._loop.call_soon_threadsafe(self._on_message, message)
            if message[0] == "dead":
                return

    def _on_message(self, message: tuple) -> None:
        try:
            self._handle(message)
        except Exception as exc:  # noqa: BLE001 - a message we cannot handle must not leave streams waiting
            logger.exception("could not handle the engine core's %r message", message[0])
            self._on_dead(f"the API process could not handle an engine core message: {type(exc).__name__}: {exc}")
            self._on_hung()

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "step":
            _, deltas, snapshot, adds_seen, num_tokens = message
            self._snapshot, self._num_adds_seen = snapshot, adds_seen
            if self.on_step is not None:
                self.on_step(num_tokens)
            # aborted requests' late deltas are dropped (their decoder state is gone)
            self._deliver([self._decoder.decode(d) for d in deltas if d[0] in self._decoder])
        elif kind == "stats":
            self._snapshot, self._num_adds_seen = message[1], message[2]
        elif kind == "rejected":
            self._decoder.forget(message[1])
            self._deliver_error(message[1], ValueError(message[2]))
        elif kind == "dead":
            self._on_dead(message[1])

    def _on_dead(self, reason: str) -> None:
        if self.error is not None:
            return
        logger.error("engine core failed: %s", reason)
        self.error = EngineDeadError(f"the engine failed: {reason}")
        self._fail_all(self.error)

    def _on_hung(self) -> None:
        """The core is stuck or out of step with us: kill it (SIGKILL works on a stopped process too)."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._process.kill()

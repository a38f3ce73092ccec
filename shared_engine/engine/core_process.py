"""The engine core's own process: `LLMEngine` steps with no HTTP server beside it.

Why a process (as vLLM V1's EngineCore): in one process the API server's event loop (parsing requests,
serialising one SSE chunk per token per stream) and the engine loop (scheduling, building inputs,
launching the step, turning tokens into text) take turns on one GIL. Measured on the H200 at 200 RAG
users (case_rag_chatbot, README "The Fix"): a step took 41 ms in the server against 22-24 ms for the
same step alone on the GPU. Here the engine loop has a whole interpreter to itself.

Protocol, over two one-way `multiprocessing` pipes (pickled tuples):
    API -> core   ("add", request_id, prompt_token_ids, params, prompt, cache_salt, lora_request, scheduling)
                  (scheduling: a dict of `LLMEngine.add_request` keywords: priority, tenant)
                  ("abort", request_id)
                  ("shutdown",)
    core -> API   ("ready", EngineInfo)                    once, after the engine is built
                  ("failed", message)                      instead of ready: the engine could not start
                  ("step", [delta, ...], EngineSnapshot, num_adds_seen, num_tokens)
                                                           after every step (deltas: output_delta.py)
                  ("rejected", request_id, message)        add_request raised ValueError
                  ("stats", EngineSnapshot, num_adds_seen) after commands handled while idle
                  ("heartbeat",)                           every idle wait (0.5 s) with nothing else to
                                                           send: the API side's watchdog (heartbeat.py)
                                                           declares a silent core hung
                  ("dead", message)                        a step raised, or a tensor-parallel worker
                                                           died; the process then exits
The core exits on "shutdown", when the API side's pipe closes (the API process is gone), or after "dead".
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

from shared_engine.config import EngineConfig

logger = logging.getLogger("shared_engine")

IDLE_WAIT_S = 0.5
LOG_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


@dataclass(frozen=True)
class EngineInfo:
    """What the API process needs from a built engine: its final config (max_model_len resolved), the
    model source (name, shapes, tokenizer path)."""

    config: EngineConfig
    source: object  # shared_engine.model_loader.model_source.ModelSource
    max_model_len: int


def run_engine_core(config: EngineConfig, commands: Connection, results: Connection,
                    log_level: int = logging.INFO) -> None:
    """Entry point of the engine core process (`multiprocessing` spawn target)."""
    # Ctrl-C reaches the whole process group: the API process decides when the core stops ("shutdown").
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    from shared_engine.engine.engine_snapshot import EngineSnapshot
    from shared_engine.engine.llm_engine import LLMEngine
    from shared_engine.engine.output_delta import OutputDeltaEncoder

    try:
        engine = LLMEngine(config)
    except BaseException as exc:  # noqa: BLE001 - reported to the API process, which exits with it
        logger.exception("engine core failed to start")
        results.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    send = _LockedSender(results)
    add_failure_callback = getattr(engine.runner, "add_failure_callback", None)  # tensor parallelism
    if add_failure_callback is not None:
        add_failure_callback(lambda reason: _die(send, reason))
    send(("ready", EngineInfo(engine.config, engine.source, engine.max_model_len)))
    encoder = OutputDeltaEncoder()
    num_adds_seen = 0
    last_tokens = 0
    try:
        while True:
            handled = False
            timeout = 0.0 if engine.has_unfinished_requests() else IDLE_WAIT_S
            while commands.poll(timeout):
                timeout = 0.0
                command = commands.recv()
                handled = True
                kind = command[0]
                if kind == "add":
                    _, request_id, ids, params, prompt, cache_salt, lora_request, scheduling = command
                    num_adds_seen += 1
                    try:
                        engine.add_request(request_id, ids, params, prompt=prompt, cache_salt=cache_salt,
                                           lora_request=lora_request, **scheduling)
                    except ValueError as exc:
                        send(("rejected", request_id, str(exc)))
                elif kind == "abort":
                    engine.abort_request(command[1])
                    encoder.forget(command[1])
                elif kind == "shutdown":
                    engine.shutdown()
                    return
            if not engine.has_unfinished_requests():
                send(("stats", EngineSnapshot.of(engine), num_adds_seen) if handled else ("heartbeat",))
                continue
            try:
                outputs = engine.step()
            except BaseException as exc:  # noqa: BLE001 - any failure kills the engine, not the server
                logger.exception("engine step failed; failing in-flight requests")
                send(("dead", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"))
                return
            snapshot = EngineSnapshot.of(engine)
            num_tokens = snapshot.tokens_total - last_tokens
            last_tokens = snapshot.tokens_total
            send(("step", [encoder.encode(o) for o in outputs], snapshot, num_adds_seen, num_tokens))
    except (EOFError, BrokenPipeError, ConnectionResetError):
        logger.info("engine core: the API process went away; exiting")
        engine.shutdown()
    except BaseException as exc:  # noqa: BLE001 - a failed command: report it, never leave the API waiting
        logger.exception("engine core loop failed; failing in-flight requests")
        with contextlib.suppress(OSError):
            send(("dead", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=5)}"))
        engine.shutdown()


class _LockedSender:
    """`results.send` for two threads: the engine loop and the tensor-parallel worker monitor."""

    def __init__(self, results: Connection) -> None:
        self._results, self._lock = results, threading.Lock()

    def __call__(self, message: tuple) -> None:
        with self._lock:
            self._results.send(message)


def _die(send: _LockedSender, reason: str) -> None:
    """A tensor-parallel worker died (monitor thread): report the engine dead and exit now, even while the
    engine loop waits in a collective that would only fail at its timeout (NCCL)."""
    with contextlib.suppress(OSError):
        send(("dead", f"{reason}; the engine core stopped"))
    logging.shutdown()
    os._exit(1)

"""`TPExecutor`: rank 0's model runner under tensor parallelism, with the interface of `ModelRunner`.

The engine (scheduler, block manager, sampler, detokeniser) stays in rank 0's process and calls this
object as it would a `ModelRunner`. Each call that touches the model first broadcasts itself to the
worker processes (ranks 1..N-1, `worker_process.py`) over the CPU process group, then runs on rank 0's
own runner; inside it every rank runs the same forward pass on its shard, meeting at the layers'
collectives. Only rank 0 samples; `collect`, `release` and the counters are rank 0's alone.

Lifecycle: `__init__` starts the workers (`python -m shared_engine.distributed.worker_process`, one per
rank, config pickled on stdin), joins the rendezvous and loads rank 0's shard while the workers load
theirs; `shutdown()` stops them (also run when the executor is garbage-collected or the process exits).
A worker that exits early is reported by `WorkerMonitor` (`on_failure`); every later call raises
`TPWorkerError`. One tensor-parallel engine per process (the process groups are per process).
"""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import time
import weakref
from collections.abc import Callable

from shared_engine.config import EngineConfig
from shared_engine.distributed.parallel_state import (
    all_reduce_min,
    broadcast_object,
    destroy_tensor_parallel,
    free_port,
    init_tensor_parallel,
)
from shared_engine.distributed.step_message import encode
from shared_engine.distributed.worker_monitor import WorkerMonitor
from shared_engine.distributed.worker_process import WorkerArgs

logger = logging.getLogger("shared_engine")

SHUTDOWN_TIMEOUT_S = 10.0


class TPWorkerError(RuntimeError):
    """A tensor-parallel worker process is gone; the engine cannot run another step."""


def make_model_runner(config: EngineConfig, source, grammar=None):
    """A `ModelRunner` (TP=1) or a `TPExecutor` driving `tensor_parallel_size` ranks. `grammar` (structured
    outputs) is rank 0's: only rank 0 samples."""
    from shared_engine.model_executor.model_runner import ModelRunner
    from shared_engine.model_executor.nano_batch import check_supported

    check_supported(config)  # before any rank starts
    if config.parallel.tensor_parallel_size == 1:
        return ModelRunner(config, source, grammar)
    return TPExecutor(config, source, grammar)


class TPExecutor:
    def __init__(self, config: EngineConfig, source, grammar=None) -> None:
        from shared_engine.model_executor.model_runner import ModelRunner

        tp = config.parallel.tensor_parallel_size
        device_type = config.device.resolve()
        _check_devices(device_type, tp)
        self.error: str | None = None
        self._failure_callbacks: list[Callable[[str], None]] = []
        port = free_port()
        level = logging.getLogger().level
        self.workers = {rank: _spawn(WorkerArgs(config, source, rank, tp, port, level)) for rank in range(1, tp)}
        on_failure = weakref.WeakMethod(self._on_failure)  # the monitor's threads must not keep self alive
        self.monitor = WorkerMonitor(self.workers, lambda reason: (on_failure() or _ignore)(reason))
        self._stop_state = {"graceful": False}
        self._finalizer = weakref.finalize(self, _stop, self.workers, self.monitor, self._stop_state)
        try:
            init_tensor_parallel(0, tp, port, device_type)
            self.runner = ModelRunner(config, source, grammar)
        except BaseException:
            self._finalizer()
            raise

    # ---- failures ------------------------------------------------------------------------------------
    def add_failure_callback(self, callback: Callable[[str], None]) -> None:
        """`callback(reason)` runs on the monitor's thread when a worker dies (the engine core process
        reports the engine dead and exits from there, even while its main thread waits in a collective)."""
        self._failure_callbacks.append(callback)

    def _on_failure(self, reason: str) -> None:
        self.error = reason
        for callback in self._failure_callbacks:
            callback(reason)
        for proc in self.workers.values():  # the survivors' sockets close: rank 0's collective fails now
            if proc.poll() is None:
                proc.kill()

    @property
    def healthy(self) -> bool:
        return self.error is None

    def _check_workers(self, wait_s: float = 0.0) -> None:
        """Raise `TPWorkerError` if a worker has exited (waiting up to `wait_s` for one that is exiting)."""
        deadline = time.monotonic() + wait_s
        while self.error is None:
            for rank, proc in self.workers.items():
                if proc.poll() is not None:
                    self.error = (f"tensor-parallel worker rank {rank} (pid {proc.pid}) exited with code "
                                  f"{proc.returncode}")
            if self.error is not None or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        if self.error is not None:
            raise TPWorkerError(self.error)

    def _call(self, *call) -> None:
        self._check_workers()
        try:
            broadcast_object(call)
        except RuntimeError:
            self._check_workers(wait_s=2.0)  # name the rank that is gone, if one is
            raise

    # ---- ModelRunner's interface ---------------------------------------------------------------------
    def free_kv_bytes(self) -> int | None:
        self._call("free_kv_bytes")
        free = self.runner.free_kv_bytes()
        return None if free is None else all_reduce_min(free)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self._call("allocate_kv_cache", num_blocks)
        self.runner.allocate_kv_cache(num_blocks)

    def capture_cuda_graphs(self) -> None:
        self._call("capture_cuda_graphs")
        self.runner.capture_cuda_graphs()

    def launch(self, out, previous=None):
        self._call("launch", encode(out), previous is not None)
        try:
            return self.runner.launch(out, previous)
        except RuntimeError:  # a collective failed: a peer died mid-step (gloo notices at once)
            self._check_workers(wait_s=2.0)
            raise

    def collect(self, step):
        return self.runner.collect(step)

    def execute(self, out):
        return self.collect(self.launch(out))

    def __getattr__(self, name: str):  # counters, dtype, device, kv_bytes_per_block, release, ...
        if name == "runner":
            raise AttributeError(name)
        return getattr(self.runner, name)

    def shutdown(self) -> None:
        """Stop the workers and leave the process groups (idempotent)."""
        if self._finalizer.alive and self.error is None:
            self.monitor.stopping = True  # before the workers exit: their exits are not failures
            try:
                broadcast_object(("shutdown",))
                self._stop_state["graceful"] = True
            except RuntimeError:  # a worker is already gone
                pass
        self._finalizer()


def _check_devices(device_type: str, tp: int) -> None:
    if device_type != "cuda":
        return
    import torch

    if torch.cuda.device_count() < tp:
        raise ValueError(f"tensor_parallel_size {tp} needs {tp} GPUs; {torch.cuda.device_count()} visible")


def _spawn(args: WorkerArgs) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "shared_engine.distributed.worker_process"],
                            stdin=subprocess.PIPE)
    proc.stdin.write(pickle.dumps(args))
    proc.stdin.close()
    return proc


def _ignore(reason: str) -> None:
    pass


def _stop(workers: dict[int, subprocess.Popen], monitor: WorkerMonitor, state: dict) -> None:
    """Wait for workers told to shut down; kill them otherwise (garbage collection, exit, a failure)."""
    monitor.stopping = True
    for proc in workers.values():
        if not state["graceful"] and proc.poll() is None:
            proc.kill()
    for proc in workers.values():
        try:
            proc.wait(SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("tensor-parallel worker pid %d did not stop; killing it", proc.pid)
            proc.kill()
            proc.wait()
    destroy_tensor_parallel(peers_alive=state["graceful"])

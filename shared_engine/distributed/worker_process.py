"""A tensor-parallel worker: ranks 1..N-1, each in its own process, started by `TPExecutor` (rank 0).

`python -m shared_engine.distributed.worker_process` reads its `WorkerArgs` (pickled) from stdin, joins
the process groups, builds its `ModelRunner` (its shard of every layer, its KV heads' cache) and then
repeats, until told to stop: receive rank 0's next call over the CPU group, run it. Calls, in the order
rank 0 makes them (each runs the same collectives on every rank):
    ("free_kv_bytes",)            profile (CUDA), then the smallest free KV bytes over the ranks
    ("allocate_kv_cache", n)      n blocks of this rank's KV heads per layer
    ("capture_cuda_graphs",)      this rank's graphs (CUDA)
    ("launch", message, has_previous)  one step: `message` is `step_message.encode` of rank 0's step
    ("shutdown",)
The worker dies with rank 0: PR_SET_PDEATHSIG on Linux, a parent-pid check otherwise, and a closed
gloo connection ends a pending receive with an error either way.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import pickle
import signal
import sys
import threading
import time
from dataclasses import dataclass

from shared_engine.config import EngineConfig

logger = logging.getLogger("shared_engine")


@dataclass(frozen=True)
class WorkerArgs:
    config: EngineConfig
    source: object  # ModelSource
    rank: int
    world_size: int
    port: int
    log_level: int


def _die_with_parent() -> None:
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def run_worker(args: WorkerArgs) -> None:
    from shared_engine.distributed.parallel_state import (
        all_reduce_min,
        broadcast_object,
        destroy_tensor_parallel,
        init_tensor_parallel,
    )
    from shared_engine.distributed.step_message import decode
    from shared_engine.model_executor.model_runner import ModelRunner

    init_tensor_parallel(args.rank, args.world_size, args.port, args.config.device.resolve())
    runner = ModelRunner(args.config, args.source)
    previous = None
    while True:
        call = broadcast_object()
        method = call[0]
        if method == "launch":
            _, message, has_previous = call
            previous = runner.launch(decode(message), previous if has_previous else None)
        elif method == "free_kv_bytes":
            free = runner.free_kv_bytes()
            if free is not None:
                all_reduce_min(free)
        elif method == "allocate_kv_cache":
            runner.allocate_kv_cache(call[1])
        elif method == "capture_cuda_graphs":
            runner.capture_cuda_graphs()
        elif method == "shutdown":
            break
        else:
            raise RuntimeError(f"unknown call {method!r} from rank 0")
    destroy_tensor_parallel()


def main() -> None:
    _die_with_parent()
    args: WorkerArgs = pickle.load(sys.stdin.buffer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group; rank 0 decides
    logging.basicConfig(level=args.log_level, format=f"%(levelname)s %(asctime)s rank{args.rank}: %(message)s")
    try:
        run_worker(args)
    except Exception:
        logger.exception("tensor-parallel worker rank %d failed", args.rank)
        os._exit(1)


if __name__ == "__main__":
    main()

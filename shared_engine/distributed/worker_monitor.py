"""`WorkerMonitor`: rank 0's watchdog over its worker processes.

A rank that dies mid-step leaves the others in a collective: gloo notices the closed sockets at once,
NCCL only at its timeout, and a rank that dies while the engine is idle is noticed by nobody until the
next step. So one thread per worker waits for its exit and, unless the engine is shutting down, calls
`on_failure(reason)` at once: the engine core process reports the engine dead and exits (the server
answers /health 503 and fails in-flight requests), the offline engine marks itself failed and stops the
other workers, so that rank 0's pending collective fails rather than waits.
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable

logger = logging.getLogger("shared_engine")


class WorkerMonitor:
    def __init__(self, workers: dict[int, subprocess.Popen], on_failure: Callable[[str], None]) -> None:
        """`workers`: rank → its process."""
        self.on_failure = on_failure
        self.stopping = False
        self._fired = threading.Lock()
        for rank, proc in workers.items():
            threading.Thread(target=self._watch, args=(rank, proc), name=f"tp-monitor-{rank}", daemon=True).start()

    def _watch(self, rank: int, proc: subprocess.Popen) -> None:
        code = proc.wait()
        if self.stopping or not self._fired.acquire(blocking=False):
            return  # a shutdown, or another rank's failure already reported
        reason = f"tensor-parallel worker rank {rank} (pid {proc.pid}) exited with code {code}"
        logger.error("%s; the engine cannot continue", reason)
        self.on_failure(reason)

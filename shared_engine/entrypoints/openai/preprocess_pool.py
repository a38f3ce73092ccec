"""`PreprocessPool`: tokenisation and chat templating off the event loop, in two lanes, so that requests with
huge inputs cannot queue the others behind them.

On the event loop a 7 MB prompt delayed /health by 3 s; in one shared pool, two such prompts occupy both
workers and every small request's tokenisation waits behind them. Here jobs whose request carries more than
`large_bytes` of input (its body size or its prompts' bytes) run in a lane of their own with one worker,
and at most `max_large` of them are admitted (running or waiting): past that a request gets 503 with
`Retry-After` at once, before any work. Small jobs have `small_workers` workers that large ones never use.
Hugging Face fast tokenizers release the GIL while encoding, so the lanes run in parallel.

The large lane's thread runs at a lower CPU priority (`large_nice`, Linux: a thread's own nice value): on
a machine whose cores are all busy, tokenising a huge prompt takes CPU from the engine core's step and the
event loop last, not first. (A thread that holds the GIL at low priority would delay the event loop: the
chat template's Python does, in slices of the interpreter's 5 ms switch interval; body JSON is parsed on
the loop itself, body_precheck.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from shared_engine.entrypoints.openai.errors import overloaded


class PreprocessPool:
    def __init__(self, small_workers: int = 2, large_bytes: int = 64 * 1024, max_large: int = 4,
                 large_nice: int = 10) -> None:
        self.large_bytes, self.max_large = large_bytes, max_large
        self._small = ThreadPoolExecutor(small_workers, thread_name_prefix="tokenizer")
        self._large = ThreadPoolExecutor(1, thread_name_prefix="tokenizer-large", initializer=_lower_priority,
                                         initargs=(large_nice,))
        self.large_admitted = 0

    async def run(self, fn: Callable, *args, size: int = 0):
        """`fn(*args)` in the lane for an input of `size` bytes, awaited (exceptions propagate).

        Raises:
            APIError: 503 (Retry-After) when `size` is over `large_bytes` and `max_large` large jobs are
                admitted already.
        """
        loop = asyncio.get_running_loop()
        if size <= self.large_bytes:
            return await loop.run_in_executor(self._small, fn, *args)
        if self.large_admitted >= self.max_large:
            raise overloaded(f"the server is busy with {self.large_admitted} requests over {self.large_bytes} bytes "
                             "of input (--max-large-inputs); retry later")
        self.large_admitted += 1
        try:
            return await loop.run_in_executor(self._large, fn, *args)
        finally:
            self.large_admitted -= 1


def _lower_priority(nice: int) -> None:
    """Raise this thread's nice value by `nice` (no privileges needed; a no-op where unsupported)."""
    with contextlib.suppress(AttributeError, OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)

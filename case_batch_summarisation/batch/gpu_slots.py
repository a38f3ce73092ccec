"""One GPU per shard worker on a multi-GPU host: the worker holds an exclusive lock on one slot file per GPU
for as long as its engine runs, and gives the engine that GPU alone (`CUDA_VISIBLE_DEVICES`). Airflow's
pool (sized to the GPUs) bounds how many workers run at once, so a slot is always free; the lock makes the
assignment safe anyway (a second worker waits instead of sharing a GPU). Standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def gpu_slot(lock_dir: Path, num_gpus: int, poll_s: float = 0.5) -> Iterator[int | None]:
    """Yields the GPU index held (None when `num_gpus` is 0: a CPU host, nothing to hold)."""
    if num_gpus <= 0:
        yield None
        return
    lock_dir = Path(lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for gpu in range(num_gpus):
            fd = os.open(lock_dir / f"gpu-{gpu}.lock", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield gpu
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        time.sleep(poll_s)

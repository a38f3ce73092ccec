"""The tensor-parallel process groups of this process and the collectives the layers call.

Two groups over the same ranks (as vLLM's): the device group (NCCL on CUDA, gloo on the CPU) carries the
layers' all-reduces and the LM head's all-gather; a gloo group on the CPU carries Python objects (each
step's inputs, from rank 0) and small integers. Before `init_tensor_parallel` (TP=1, or a process that
never joined a group) every collective is the identity, so the layers run unchanged in one process.

Timeouts, so that a lost rank ends in an error rather than a hang: device-group collectives give up after
`SHARED_ENGINE_TP_TIMEOUT_S` seconds (default 300: a step's collectives wait only for the slowest rank's
share of the same step); the CPU group waits up to 7 days, because a worker blocks there for the next step
while the server is idle. A peer that dies closes its sockets, so gloo fails at once; NCCL waits for the
timeout, which is why rank 0 also watches its workers (`worker_monitor.py`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 300.0
_CPU_GROUP_TIMEOUT = timedelta(days=7)


@dataclass(frozen=True)
class TPState:
    rank: int
    world_size: int
    device_group: object  # torch.distributed.ProcessGroup
    cpu_group: object  # gloo ProcessGroup
    backend: str  # "nccl" or "gloo"


_STATE: TPState | None = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for the rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collective_timeout_s() -> float:
    return float(os.environ.get("SHARED_ENGINE_TP_TIMEOUT_S", DEFAULT_TIMEOUT_S))


def init_tensor_parallel(rank: int, world_size: int, port: int, device_type: str) -> None:
    """Join the rendezvous at 127.0.0.1:`port` as `rank` of `world_size` (every rank must call this; it
    blocks until all have). On CUDA rank r uses GPU r; NVLink multicast (NVLS) is left off."""
    global _STATE
    backend = "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl":
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        torch.cuda.set_device(rank)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=collective_timeout_s()))
    cpu_group = dist.new_group(backend="gloo", timeout=_CPU_GROUP_TIMEOUT)
    _STATE = TPState(rank, world_size, dist.group.WORLD, cpu_group, backend)


def destroy_tensor_parallel(peers_alive: bool = True) -> None:
    """Leave the process groups. With `peers_alive` False (workers killed) an NCCL group is only dropped:
    destroying a communicator whose peers are gone can block."""
    global _STATE
    if _STATE is not None and dist.is_initialized() and (peers_alive or _STATE.backend == "gloo"):
        dist.destroy_process_group()
    _STATE = None


def get_tp_rank() -> int:
    return 0 if _STATE is None else _STATE.rank


def get_tp_world_size() -> int:
    return 1 if _STATE is None else _STATE.world_size


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum `x` over the ranks, in place; returns it."""
    if _STATE is None or _STATE.world_size == 1:
        return x
    dist.all_reduce(x, group=_STATE.device_group)
    return x


def tp_all_gather(x: torch.Tensor) -> torch.Tensor:
    """`x` `[rows, cols]` on every rank → `[rows, world_size * cols]`, rank r's columns at r * cols."""
    if _STATE is None or _STATE.world_size == 1:
        return x
    x = x.contiguous()
    out = torch.empty((_STATE.world_size, *x.shape), dtype=x.dtype, device=x.device)  # [tp, rows, cols]
    if _STATE.backend == "nccl":
        dist.all_gather_into_tensor(out, x, group=_STATE.device_group)
    else:
        dist.all_gather(list(out.unbind(0)), x, group=_STATE.device_group)
    return out.permute(1, 0, 2).reshape(x.shape[0], -1)


def tp_broadcast(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's `x` into every rank's `x` (same shape and dtype), in place; returns it."""
    if _STATE is not None and _STATE.world_size > 1:
        dist.broadcast(x, src=0, group=_STATE.device_group)
    return x


def broadcast_object(obj=None):
    """Rank 0's picklable `obj` to every rank (the others pass None); returns it on every rank."""
    if _STATE is None or _STATE.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_STATE.cpu_group)
    return box[0]


def all_reduce_min(value: int) -> int:
    """The smallest of every rank's `value` (CPU group)."""
    if _STATE is None or _STATE.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=_STATE.cpu_group)
    return int(t.item())

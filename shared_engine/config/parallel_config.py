"""How the model is split across devices (tensor parallelism)."""

from __future__ import annotations

from dataclasses import dataclass

from shared_engine.config.validation import check_range


@dataclass(frozen=True)
class ParallelConfig:
    """`tensor_parallel_size` (vLLM's `--tensor-parallel-size`): ranks, one worker process each, that
    share every layer (Megatron-style column/row-parallel linears, heads split across ranks). Rank 0 is
    the engine's own process (scheduler, block manager, sampler); ranks 1..N-1 are worker processes it
    starts (shared_engine/distributed/). On CUDA rank r uses GPU r and collectives run over NCCL; on the
    CPU over gloo. 1 = no worker processes, no torch.distributed."""

    tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        check_range("tensor_parallel_size", self.tensor_parallel_size, 1, 64)

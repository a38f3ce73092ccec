"""`AttentionMetadata`: the batch layout every attention backend reads (vLLM's varlen layout)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class AttentionMetadata:
    """One step's flattened batch: sequences ordered decodes first, then prefill chunks.

    Sequence b owns query tokens [cu_seqlens_q[b], cu_seqlens_q[b+1]) and, after this step, has
    `context_lens[b]` tokens of KV in the cache; its new tokens sit at the last positions of that context.
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: flat KV slot per new token (-1 = padding, skipped)
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32
    context_lens: torch.Tensor  # [num_seqs] int32: KV length after this step
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32
    num_decodes: int  # the first num_decodes sequences have exactly one query token
    max_context_len: int
    max_query_len: int
    context_lens_list: list[int]
    query_lens_list: list[int]
    # Cascade decode attention (Triton backend; see `cascade.py`): the decodes' block tables all begin with
    # `prefix_blocks[:prefix_len // block_size]`, and prefix_len < every decode's context length (but a CUDA
    # graph's padding rows: see cuda_graph_runner.py). None: plain paged decode attention. Tensors, not ints,
    # so one CUDA graph serves every prefix length.
    prefix_len: torch.Tensor | None = None  # [1] int32, tokens, a multiple of block_size
    prefix_blocks: torch.Tensor | None = None  # [>= prefix_len // block_size] int32: the shared block ids
    max_prefix_len: int = 0  # tokens, >= prefix_len: sizes the prefix kernel's split grid
    # Per-step plans a backend derives from this layout once and reuses in every layer (e.g. the torch
    # backend's decode length buckets); keyed by the backend.
    backend_cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def num_seqs(self) -> int:
        return len(self.context_lens_list)

    @property
    def use_cascade(self) -> bool:
        return self.prefix_len is not None

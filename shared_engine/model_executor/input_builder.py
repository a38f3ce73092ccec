"""Flatten a `SchedulerOutput` into the model's step tensors (varlen layout, no padding)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared_engine.core.scheduler_output import SchedulerOutput
from shared_engine.model_executor.attention.metadata import AttentionMetadata


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    sample_indices: torch.Tensor  # [num_sampled] int64: last token of each sequence that samples
    sampled_rows: list[int]  # scheduler-output index of each sampled sequence


def build_inputs(out: SchedulerOutput, block_size: int, device: torch.device) -> StepInputs:
    """Scheduled sequences must come decodes first (the scheduler's order)."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    cu = [0]
    context_lens, query_lens = [], []
    sample_indices, sampled_rows = [], []
    num_decodes = 0
    max_blocks = 1
    for row, item in enumerate(out.scheduled):
        n, start = item.num_new_tokens, item.start_position
        if item.is_decode and num_decodes == row:
            num_decodes += 1
        input_ids.extend(item.token_ids)
        positions.extend(range(start, start + n))
        table = item.block_table
        slots.extend(table[p // block_size] * block_size + p % block_size for p in range(start, start + n))
        cu.append(cu[-1] + n)
        context_lens.append(start + n)
        query_lens.append(n)
        max_blocks = max(max_blocks, len(table))
        if item.needs_sample:
            sample_indices.append(cu[-1] - 1)
            sampled_rows.append(row)
    tables = torch.tensor([s.block_table + [0] * (max_blocks - len(s.block_table)) for s in out.scheduled],
                          dtype=torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=tables.to(device),
        context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
        cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=device),
        num_decodes=num_decodes,
        max_context_len=max(context_lens),
        max_query_len=max(query_lens),
        context_lens_list=context_lens,
        query_lens_list=query_lens,
    )
    return StepInputs(
        input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        meta=meta,
        sample_indices=torch.tensor(sample_indices, dtype=torch.int64, device=device),
        sampled_rows=sampled_rows,
    )

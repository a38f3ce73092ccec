"""Flatten a `SchedulerOutput` into the model's step tensors (varlen layout, no padding)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from shared_engine.core.scheduler_output import SchedulerOutput
from shared_engine.model_executor.attention.cascade import cascade_prefix_blocks
from shared_engine.model_executor.attention.metadata import AttentionMetadata
from shared_engine.model_executor.pinned_staging import PinnedStaging


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    # [num_logits] int64: the tokens whose logits the step needs: the last of each sequence that samples,
    # and for a speculative decode its last k + 1 (the verified token's and each draft's), in row order
    sample_indices: torch.Tensor
    sampled_rows: list[int]  # scheduler-output index of each sampled sequence
    num_logits: list[int]  # per sampled sequence: its rows in `sample_indices` (1, or k + 1 with k drafts)
    # async scheduling: token indices whose id is the previous step's sampled id (a placeholder, -(i + 1) for
    # its i-th sampled row; 0 in `input_ids` until `patch_placeholders`), and those rows i; None when none
    placeholders: tuple[torch.Tensor, torch.Tensor] | None = None

    def patch_placeholders(self, previous_tokens: torch.Tensor | None) -> None:
        """Fill the placeholder inputs from the previous step's sampled ids `[num_sampled]` int64 (on the
        device: no wait for it). Raises RuntimeError when there are placeholders but no previous step."""
        if self.placeholders is None:
            return
        if previous_tokens is None:
            raise RuntimeError("the step's inputs include tokens of a previous step that is not in flight")
        where, rows = self.placeholders
        self.input_ids.index_copy_(0, where, previous_tokens.index_select(0, rows))


def build_inputs(out: SchedulerOutput, block_size: int, device: torch.device, cascade: bool = False,
                 staging: PinnedStaging | None = None, max_decode_rows: int | None = None,
                 short_chunks_as_rows: bool = False) -> StepInputs:
    """Scheduled sequences must come decodes first (the scheduler's order: decodes, speculative decodes, then
    prefill chunks). Host work is O(tokens) in numpy; each tensor crosses to the device once. With `cascade`
    (the Triton backend, cascade attention allowed), a step whose decodes share a long enough block-table prefix
    carries it in the metadata (`cascade_prefix_blocks`). With `staging` (CUDA) the arrays cross in one copy
    from pinned memory.

    Decode rows (`decode_rows`): in a step of decodes and speculative decodes only (with `short_chunks_as_rows`,
    of short continuations: a draft model's step 0), a sequence of n tokens at positions p .. p + n - 1 is given
    to the attention kernels as n decode rows, row j one query at position p + j with context p + j + 1 over the
    request's block table (the KV of all n tokens is written before attention reads it), so a speculative step's
    verification runs through the decode kernels and the decode CUDA graphs; tokens, positions, slots and logits
    rows are the same as for one sequence of n queries. Only where the step's rows fit `max_decode_rows` (the
    largest decode graph; None: no limit); otherwise such a sequence runs through the prefill path's causal
    attention over its context."""
    scheduled = out.scheduled
    item_lens = [s.num_new_tokens for s in scheduled]
    starts, query_lens, tables_of = decode_rows(scheduled, max_decode_rows, short_chunks_as_rows,
                                                out.num_draft_tokens > 0)
    num_seqs = len(query_lens)
    context_lens = [a + n for a, n in zip(starts, query_lens)]
    cu = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(query_lens, out=cu[1:])
    max_blocks = max(len(t) for t in tables_of)
    tables = np.zeros((num_seqs, max_blocks), dtype=np.int32)
    for row, table in enumerate(tables_of):
        tables[row, : len(table)] = table
    num_decodes = 0
    while num_decodes < num_seqs and query_lens[num_decodes] == 1 and starts[num_decodes] > 0:
        num_decodes += 1
    if cu[-1] == len(scheduled):  # one token per scheduled sequence (decode-only): no per-token expansion needed
        positions = np.asarray(starts, dtype=np.int64)
        input_ids = np.fromiter((s.token_ids[0] for s in scheduled), dtype=np.int64, count=num_seqs)
        rows = np.arange(num_seqs)
    else:
        rows = np.repeat(np.arange(num_seqs), query_lens)
        positions = np.arange(cu[-1], dtype=np.int64) - np.repeat(cu[:-1], query_lens) + np.repeat(starts, query_lens)
        input_ids = np.fromiter((t for s in scheduled for t in s.token_ids), dtype=np.int64, count=int(cu[-1]))
    placeholders = np.flatnonzero(input_ids < 0)
    previous_rows = -input_ids[placeholders] - 1
    input_ids[placeholders] = 0
    slots = tables[rows, positions // block_size].astype(np.int64) * block_size + positions % block_size
    sampled_rows = [row for row, s in enumerate(scheduled) if s.needs_sample]
    num_logits = [scheduled[row].num_logits for row in sampled_rows]
    ends = np.cumsum(item_lens)[sampled_rows]  # each sampled sequence's end in the step's tokens
    if out.num_draft_tokens:  # each sampled row's last num_logits tokens
        counts = np.asarray(num_logits, dtype=np.int64)
        firsts = np.cumsum(counts) - counts
        sample_indices = np.repeat(ends - counts, counts) + np.arange(int(counts.sum())) - np.repeat(firsts, counts)
    else:
        sample_indices = ends - 1

    num_prefix_blocks = cascade_prefix_blocks(tables, context_lens, num_decodes, block_size) if cascade else 0
    arrays = [slots, tables, np.asarray(context_lens, dtype=np.int32), cu.astype(np.int32), input_ids, positions,
              np.asarray(sample_indices, dtype=np.int64)]
    if num_prefix_blocks:
        arrays += [np.array([num_prefix_blocks * block_size], dtype=np.int32), tables[0, :num_prefix_blocks].copy()]
    if placeholders.size:
        arrays += [placeholders, previous_rows]
    if staging is not None:  # one copy from pinned memory (pinned_staging.py)
        tensors = staging.upload(arrays)
    else:
        tensors = [torch.from_numpy(a).to(device, non_blocking=True) for a in arrays]
    slot_mapping, block_tables, context_lens_t, cu_seqlens_q, ids, pos, indices, *rest = tensors
    meta = AttentionMetadata(
        slot_mapping=slot_mapping,
        block_tables=block_tables,
        context_lens=context_lens_t,
        cu_seqlens_q=cu_seqlens_q,
        num_decodes=num_decodes,
        max_context_len=max(context_lens),
        max_query_len=max(query_lens),
        context_lens_list=context_lens,
        query_lens_list=query_lens,
    )
    if num_prefix_blocks:
        meta.prefix_len, meta.prefix_blocks, *rest = rest
        meta.max_prefix_len = num_prefix_blocks * block_size
    return StepInputs(ids, pos, meta, indices, sampled_rows, num_logits, tuple(rest) if rest else None)


MAX_ROWS_PER_SEQUENCE = 16  # the longest query given to the kernels as decode rows (k + 2 for k <= 14)


def decode_rows(scheduled: list, max_decode_rows: int | None, short_chunks: bool = False,
                has_drafts: bool = True) -> tuple[list[int], list[int], list[list[int]]]:
    """Per sequence as the attention kernels see it (start position, query length, block table): the scheduled
    sequences, except that in a step of decodes and speculative decodes only (with `short_chunks`, of sequences
    that each continue a cached context with at most MAX_ROWS_PER_SEQUENCE tokens: a draft model's step 0) whose
    tokens fit `max_decode_rows`, a sequence of n tokens is n decode rows (`build_inputs`). A target step with a
    prompt chunk keeps it as a sequence (its decodes keep their shared-prefix cascade, which rows of a chunk
    sharing nothing would turn off). `has_drafts` False (a step without speculative decodes) skips the checks:
    the plain layout, with no pass over the step (the large-batch decode step's hot path)."""
    if short_chunks:
        short = all(s.start_position > 0 and s.num_new_tokens <= MAX_ROWS_PER_SEQUENCE for s in scheduled)
    elif has_drafts:
        short = all(s.is_decode or (s.is_spec_decode and s.num_new_tokens <= MAX_ROWS_PER_SEQUENCE)
                    for s in scheduled)
    else:
        short = False
    rows = sum(s.num_new_tokens for s in scheduled) if short else 0
    if not short or rows == len(scheduled) or (max_decode_rows is not None and rows > max_decode_rows):
        return ([s.start_position for s in scheduled], [s.num_new_tokens for s in scheduled],
                [s.block_table for s in scheduled])
    starts, tables = [], []
    for s in scheduled:
        starts.extend(range(s.start_position, s.start_position + s.num_new_tokens))
        tables.extend([s.block_table] * s.num_new_tokens)
    return starts, [1] * len(starts), tables

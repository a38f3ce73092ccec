"""Speculative decodes as decode rows (input_builder.decode_rows, issue 17): in a step of decodes only, a k + 1-token
speculative decode reaches the attention kernels as k + 1 one-query rows over its block table, so verification
runs the decode kernels and decode CUDA graphs; tokens, positions, slots and logits rows do not change. And the
attention it computes equals the causal prefill path's (torch backend)."""

from __future__ import annotations

import numpy as np
import torch

from shared_engine.core.request import Request
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.model_executor.attention.torch_backend import TorchPagedAttention
from shared_engine.model_executor.input_builder import build_inputs
from shared_engine.sampling_params import SamplingParams


def _item(rid: str, tokens: list[int], start: int, table: list[int], drafts: int = 0) -> ScheduledRequest:
    request = Request(rid, [1] * start, SamplingParams(max_tokens=16), max_tokens=16)
    return ScheduledRequest(request, tokens, start, table, True, num_draft_tokens=drafts)


def _step(extra: list[ScheduledRequest] = ()) -> SchedulerOutput:
    items = [_item("a", [7], 20, [3, 4]), _item("b", [8], 5, [9]),
             _item("s", [11, 12, 13, 14], 30, [5, 6, 2], drafts=3), *extra]
    return SchedulerOutput(items, num_batched_tokens=sum(len(i.token_ids) for i in items), num_draft_tokens=3)


def test_a_speculative_decode_becomes_one_row_per_token():
    inputs = build_inputs(_step(), 16, torch.device("cpu"))
    meta = inputs.meta
    assert meta.num_decodes == meta.num_seqs == 6 and meta.max_query_len == 1
    assert meta.context_lens_list == [21, 6, 31, 32, 33, 34]
    assert meta.cu_seqlens_q.tolist() == list(range(7))
    assert meta.block_tables[2:].tolist() == [[5, 6, 2]] * 4
    assert inputs.input_ids.tolist() == [7, 8, 11, 12, 13, 14]
    assert inputs.positions.tolist() == [20, 5, 30, 31, 32, 33]
    assert inputs.sample_indices.tolist() == [0, 1, 2, 3, 4, 5] and inputs.num_logits == [1, 1, 4]
    assert meta.slot_mapping.tolist() == [4 * 16 + 4, 9 * 16 + 5, 6 * 16 + 14, 6 * 16 + 15, 2 * 16, 2 * 16 + 1]


def test_not_where_the_rows_exceed_the_decode_graphs_or_a_prefill_chunk_is_in_the_step():
    wide = build_inputs(_step(), 16, torch.device("cpu"), max_decode_rows=5).meta
    assert (wide.num_decodes, wide.num_seqs, wide.max_query_len) == (2, 3, 4)
    mixed = build_inputs(_step([_item("p", [1, 2, 3], 0, [8])]), 16, torch.device("cpu"))
    assert (mixed.meta.num_decodes, mixed.meta.num_seqs) == (2, 4)
    assert mixed.sample_indices.tolist() == [0, 1, 2, 3, 4, 5, 8]


def test_decode_rows_attend_as_the_causal_prefill_path():
    torch.manual_seed(0)
    heads, kv_heads, dim, blocks = 4, 2, 16, 12
    k_cache = torch.randn(blocks, 16, kv_heads, dim)
    v_cache = torch.randn(blocks, 16, kv_heads, dim)
    out = _step()
    q = torch.randn(6, heads, dim)
    k, v = torch.randn(6, kv_heads, dim), torch.randn(6, kv_heads, dim)
    results = []
    for max_rows in (None, 5):  # decode rows, then one 4-query sequence through the prefill path
        inputs = build_inputs(out, 16, torch.device("cpu"), max_decode_rows=max_rows)
        kc, vc = k_cache.clone(), v_cache.clone()
        results.append(TorchPagedAttention().forward(q, k, v, kc, vc, inputs.meta, dim ** -0.5))
    np.testing.assert_allclose(results[0].numpy(), results[1].numpy(), rtol=1e-5, atol=1e-5)


def test_a_draft_models_step_zero_also_runs_as_decode_rows():
    """A proposal's step 0 (each request's owed verified tokens and its last one, no drafts) continues cached
    contexts with a few tokens: decode rows too; a chunk of more than MAX_ROWS_PER_SEQUENCE tokens is not."""
    items = [_item("a", [7], 20, [3, 4]), _item("b", [8, 9, 10], 5, [9])]
    out = SchedulerOutput(items, num_batched_tokens=4)
    meta = build_inputs(out, 16, torch.device("cpu"), short_chunks_as_rows=True).meta
    assert (meta.num_decodes, meta.num_seqs, meta.context_lens_list) == (4, 4, [21, 6, 7, 8])
    long = [_item("a", [7], 20, [3, 4]), _item("b", list(range(17)), 5, [9, 10])]
    meta = build_inputs(SchedulerOutput(long, num_batched_tokens=18), 16, torch.device("cpu"),
                        short_chunks_as_rows=True).meta
    assert (meta.num_decodes, meta.num_seqs) == (1, 2)
    # a target step's short prompt chunk stays a sequence (the decodes keep their shared-prefix cascade)
    meta = build_inputs(out, 16, torch.device("cpu")).meta
    assert (meta.num_decodes, meta.num_seqs) == (1, 2)

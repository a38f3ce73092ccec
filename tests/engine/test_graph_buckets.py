"""Which CUDA graph a step replays (`CudaGraphRunner._bucket`), checked without a GPU: the budget-filling
mixed graphs (`budget_filling_sizes`) and the fewest-padded-rows choice among the graphs that fit; the varlen
graphs of speculative steps beyond the mixed graphs' 8 sequences and their static buffers' layout."""

from __future__ import annotations

import torch

from shared_engine.core.request import Request
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.model_executor.attention.metadata import AttentionMetadata
from shared_engine.model_executor.cuda_graph_runner import (
    CudaGraphRunner,
    budget_filling_sizes,
    mixed_buckets,
    varlen_buckets,
)
from shared_engine.model_executor.input_builder import build_inputs
from shared_engine.sampling_params import SamplingParams


def _runner(max_num_seqs: int, budget: int, max_prefill: int) -> CudaGraphRunner:
    """A runner's bucket tables without capturing anything (capture needs CUDA)."""
    runner = object.__new__(CudaGraphRunner)
    decode, prefill = mixed_buckets(max_num_seqs, max_prefill)
    runner.decode_sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64]
    runner.mixed_decode_sizes, runner.mixed_prefill_sizes = decode, prefill
    runner.extra_mixed_sizes = budget_filling_sizes(decode, budget, max_prefill)
    runner.max_prefill_seqs = 8
    runner.block_tables = torch.zeros(1, 64, dtype=torch.int32)
    return runner


def _meta(num_decodes: int, chunks: list[int]) -> tuple[AttentionMetadata, int]:
    seqs = num_decodes + len(chunks)
    tokens = num_decodes + sum(chunks)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(tokens, dtype=torch.int64), block_tables=torch.zeros(seqs, 8, dtype=torch.int32),
        context_lens=torch.ones(seqs, dtype=torch.int32), cu_seqlens_q=torch.zeros(seqs + 1, dtype=torch.int32),
        num_decodes=num_decodes, max_context_len=128, max_query_len=max(chunks or [1]),
        context_lens_list=[1] * seqs, query_lens_list=[1] * num_decodes + chunks)
    return meta, tokens


def test_budget_filling_sizes_cover_every_budget_filling_step():
    decode, _ = mixed_buckets(64, 512)
    sizes = dict(budget_filling_sizes(decode, 512, 512))
    assert sizes[64] == 464 and sizes[48] == 480 and sizes[24] == 496
    for nd in range(1, 65):  # a step that fills the budget fits its decode bucket's filling graph
        d = next(b for b in decode if b >= nd)
        assert 512 - nd <= sizes[d] and sizes[d] % 16 == 0
    # above the graphed prefill sizes (the offline benchmarks' 8,192-token budget): nothing extra
    assert budget_filling_sizes(*[mixed_buckets(448, 2048)[0]], 8192, 2048) == []


def test_step_replays_the_graph_with_fewest_padded_rows():
    runner = _runner(64, 512, 512)
    assert runner._bucket(*_meta(60, [452])) == (64, 464)  # the cross product's (64, 512) pads 64 rows more
    assert runner._bucket(*_meta(40, [300, 172])) == (48, 480)
    assert runner._bucket(*_meta(60, [100])) == (64, 128)  # a small chunk: the cross product is smaller
    assert runner._bucket(*_meta(3, [16])) == (8, 16)
    assert runner._bucket(*_meta(20, [])) == (24, 0)  # decode-only
    assert runner._bucket(*_meta(60, [600])) is None  # more prefill tokens than any graph: eager
    assert runner._bucket(*_meta(2, [10] * 9)) is None  # more chunks than a graph has room for


def test_lora_steps_pick_the_base_only_variant_only_without_adapters():
    """A LoRA engine captures every graph with the LoRA layers and decode graphs also without: a step with
    no adapter token replays the base-only decode graph, any other step the graph with the layers."""
    runner = _runner(64, 512, 512)
    runner.graphs = {(d, 0, False, True): None for d in runner.decode_sizes}
    runner.graphs |= {(d, 0, False, False): None for d in runner.decode_sizes}
    runner.graphs |= {(64, 464, False, True): None}
    decode, mixed = _meta(20, []), _meta(60, [452])
    assert runner.select(*decode, lora_active=False) == (24, 0, False, False)
    assert runner.select(*decode, lora_active=True) == (24, 0, False, True)
    assert runner.select(*mixed, lora_active=False) == (64, 464, False, True)  # no base-only mixed graph
    assert runner.select(*mixed, lora_active=True) == (64, 464, False, True)
    runner.graphs = {(d, 0, False, False): None for d in runner.decode_sizes}  # an engine without LoRA
    assert runner.select(*decode) == (24, 0, False, False)


def test_pad_rows_lays_token_values_out_in_the_graph_rows():
    """Mixed graph (D=8, T=16) with 3 decodes and 5 prefill tokens: decodes at rows 0-2, padding decodes 3-7,
    prefill tokens from row 8 (what the graph's inputs look like, so the LoRA slot of every row matches)."""
    import numpy as np

    values = np.array([4, -1, 2, 7, 7, 7, 0, 0], dtype=np.int32)
    rows = CudaGraphRunner.pad_rows((8, 16, False, True), 3, values, -1)
    assert rows.tolist() == [4, -1, 2, -1, -1, -1, -1, -1, 7, 7, 7, 0, 0]
    assert CudaGraphRunner.pad_rows((8, 0, False, True), 3, values[:3], -1).tolist() == [4, -1, 2]
    assert CudaGraphRunner.pad_rows((3, 16, False, True), 3, values, -1).tolist() == values.tolist()


def _varlen_runner(max_num_seqs: int = 64, k: int = 5) -> CudaGraphRunner:
    """Buckets and static buffers on the CPU (`_layout`; capture needs CUDA)."""
    runner = object.__new__(CudaGraphRunner)
    decode, prefill = mixed_buckets(max_num_seqs, 512)
    runner._layout([1, 2, 4, 8, 16, 32, 64], decode, prefill, 8, 16, 256, torch.device("cpu"),
                   varlen_sizes=varlen_buckets(max_num_seqs, k, 8), varlen_max_query_len=k + 1)
    return runner


def test_varlen_buckets():
    assert varlen_buckets(64, 5, 8) == [(16, 96), (24, 144), (32, 192), (48, 288), (64, 384)]
    assert varlen_buckets(100, 3, 8)[-2:] == [(96, 384), (100, 400)]
    assert varlen_buckets(8, 5, 8) == [] and varlen_buckets(64, 0, 8) == []
    keys = _varlen_runner().keys(lora=True)
    assert (-16, 96, False, True) in keys and (-16, 96, False, False) not in keys  # no base-only varlen variant


def test_speculative_steps_beyond_eight_replay_varlen_graphs():
    runner = _varlen_runner()
    assert runner._bucket(*_meta(0, [6] * 8)) == (0, 64)  # 8 speculative decodes: still a mixed graph
    assert runner._bucket(*_meta(3, [6] * 8)) == (8, 64)
    assert runner._bucket(*_meta(0, [6] * 9)) == (-16, 96)  # 9: the smallest varlen graph
    assert runner._bucket(*_meta(4, [6] * 20)) == (-24, 144)  # plain decodes count as sequences there
    assert runner._bucket(*_meta(10, [6, 2, 4] * 6)) == (-32, 192)  # fewer drafts for some: still fits
    assert runner._bucket(*_meta(60, [6] * 4)) == (64, 32)  # few speculative decodes: the mixed graph
    assert runner._bucket(*_meta(0, [6] * 64 + [1])) is None  # more sequences than max_num_seqs' graph
    assert runner._bucket(*_meta(0, [6] * 9 + [100])) is None  # a prefill chunk longer than k + 1: eager
    assert runner._bucket(*_meta(0, [7] * 9)) is None  # query longer than the captured k + 1
    values = torch.arange(10).numpy()
    assert (runner.pad_rows((-16, 96, False, True), 4, values, -1) == values).all()  # the step's own rows


def test_varlen_buffers_hold_the_step_then_padding():
    """A step of 2 decodes and 10 speculative decodes in the (-16, 96) graph's buffers: tokens, positions,
    slots and sequences (decodes first) as built, padding slots -1, padding sequences empty at the end."""
    runner = _varlen_runner()
    items = []
    for i in range(12):
        request = Request(f"r{i}", list(range(20)), SamplingParams(max_tokens=8), max_tokens=8)
        drafts = 0 if i < 2 else 1 + i % 5
        tokens = [100 + i] + [200 + i] * drafts
        items.append(ScheduledRequest(request, tokens, 20 + i, [i, 20 + i, 40 + i], True, drafts))
    out = SchedulerOutput(items, num_batched_tokens=sum(len(s.token_ids) for s in items),
                          num_draft_tokens=sum(s.num_draft_tokens for s in items))
    # too wide for decode rows (its 42 tokens would fit this runner's 64-row decode graph: say 32 is the largest,
    # so that the step takes the varlen path this test is about)
    inputs = build_inputs(out, 16, torch.device("cpu"), max_decode_rows=32)
    n = inputs.input_ids.shape[0]
    key = (*runner._bucket(inputs.meta, n), False, False)
    assert key[:2] == (-16, 96)
    runner.slot_mapping.fill_(7)
    runner._fill_varlen(key, inputs.input_ids, inputs.positions, inputs.meta)
    assert torch.equal(runner.input_ids[:n], inputs.input_ids)
    assert torch.equal(runner.positions[:n], inputs.positions)
    assert torch.equal(runner.slot_mapping[:n], inputs.meta.slot_mapping)
    assert (runner.slot_mapping[n:96] == -1).all()
    assert torch.equal(runner.cu_seqlens_q[:13], inputs.meta.cu_seqlens_q)
    assert (runner.cu_seqlens_q[13:17] == n).all()  # sequences 12..15: query length 0
    assert torch.equal(runner.context_lens[:12], inputs.meta.context_lens)
    assert (runner.context_lens[12:16] == 0).all()
    assert torch.equal(runner.block_tables[:12, :3], inputs.meta.block_tables)
    meta = runner._meta(*key[:3])  # what the graph was captured with: every sequence through the prefill kernel
    assert meta.num_decodes == 0 and meta.num_seqs == 16 and meta.max_query_len == 6


def test_decode_steps_on_attention_adapters_pick_the_attention_only_variant():
    """Decode graphs are captured three ways in a LoRA engine (no LoRA, attention LoRA only, every LoRA
    layer), mixed graphs with every layer: a step whose adapters target only q/k/v/o replays the attention
    variant where its bucket has one, the full variant otherwise; a step without adapters the base-only one,
    else the cheapest variant there is."""
    from shared_engine.model_executor.layers.lora import LORA_ALL, LORA_ATTENTION, LORA_NONE

    runner = _runner(64, 512, 512)
    runner.varlen_sizes = []
    keys = runner.keys(lora=True)
    decode_keys = {k[:3] for k in keys if k[1] == 0}
    assert {k[:3] for k in keys if k[3] == LORA_ATTENTION} == decode_keys
    assert {k[:3] for k in keys if k[3] is False} == decode_keys
    assert all(k[3] is True for k in keys if k[1] > 0)  # mixed graphs: every LoRA layer
    runner.graphs = dict.fromkeys(keys)
    decode, mixed = _meta(20, []), _meta(60, [452])
    assert runner.select(*decode, lora_active=LORA_ATTENTION) == (24, 0, False, LORA_ATTENTION)
    assert runner.select(*decode, lora_active=LORA_ALL) == (24, 0, False, True)
    assert runner.select(*decode, lora_active=LORA_NONE) == (24, 0, False, False)
    assert runner.select(*mixed, lora_active=LORA_ATTENTION) == (64, 464, False, True)
    del runner.graphs[(24, 0, False, False)]
    assert runner.select(*decode, lora_active=LORA_NONE) == (24, 0, False, LORA_ATTENTION)

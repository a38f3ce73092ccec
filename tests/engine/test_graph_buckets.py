"""Which CUDA graph a step replays (`CudaGraphRunner._bucket`), checked without a GPU: the budget-filling
mixed graphs (`budget_filling_sizes`) and the fewest-padded-rows choice among the graphs that fit."""

from __future__ import annotations

import torch

from shared_engine.model_executor.attention.metadata import AttentionMetadata
from shared_engine.model_executor.cuda_graph_runner import CudaGraphRunner, budget_filling_sizes, mixed_buckets


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

"""The host-side cascade decision: the decodes' common block-table prefix and the thresholds that gate it,
on hand-made block tables (no GPU: numpy only), and its trip through `build_inputs` into the metadata."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared_engine.core.request import Request
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.model_executor.attention.cascade import (
    CASCADE_MIN_DECODES,
    CASCADE_MIN_PREFIX_TOKENS,
    cascade_prefix_blocks,
    common_prefix_blocks,
)
from shared_engine.model_executor.input_builder import build_inputs
from shared_engine.sampling_params import SamplingParams

BLOCK = 16


def tables_for(rows: list[list[int]]) -> np.ndarray:
    """Rows of block ids, zero-padded like `build_inputs` pads them: [num_seqs, max_blocks] int32."""
    tables = np.zeros((len(rows), max(map(len, rows))), dtype=np.int32)
    for i, row in enumerate(rows):
        tables[i, : len(row)] = row
    return tables


def shared_rows(num_seqs: int, num_shared: int, own: int, block_size: int = BLOCK):
    """`num_seqs` rows that start with the same `num_shared` block ids (100..), then `own` blocks of their
    own; every context ends 5 tokens into its last block. Returns (tables, context_lens)."""
    shared = list(range(100, 100 + num_shared))
    rows = [shared + [1000 + 10 * s + j for j in range(own)] for s in range(num_seqs)]
    lens = [(num_shared + own - 1) * block_size + 5] * num_seqs
    return tables_for(rows), lens


def test_thresholds_match_vllm():
    assert CASCADE_MIN_DECODES == 8 and CASCADE_MIN_PREFIX_TOKENS == 256


def test_no_sharing():
    tables, lens = shared_rows(10, 0, 30)
    assert common_prefix_blocks(tables, lens, BLOCK) == 0
    assert cascade_prefix_blocks(tables, lens, 10, BLOCK) == 0


def test_full_sharing_up_to_the_last_full_shared_block():
    tables, lens = shared_rows(10, 20, 3)
    assert common_prefix_blocks(tables, lens, BLOCK) == 20
    assert cascade_prefix_blocks(tables, lens, 10, BLOCK) == 20  # 320 tokens >= 256


def test_partial_sharing_stops_at_the_first_differing_block():
    tables, lens = shared_rows(9, 24, 2)
    tables[4, 19] = 7777  # one sequence diverges at block 19 (e.g. a different document after the prompt)
    assert common_prefix_blocks(tables, lens, BLOCK) == 19
    assert cascade_prefix_blocks(tables, lens, 9, BLOCK) == 19  # 304 tokens
    tables[8, 3] = 8888
    assert common_prefix_blocks(tables, lens, BLOCK) == 3
    assert cascade_prefix_blocks(tables, lens, 9, BLOCK) == 0  # 48 tokens < 256


def test_first_column_differs():
    tables, lens = shared_rows(8, 20, 1)
    tables[7, 0] = 5
    assert common_prefix_blocks(tables, lens, BLOCK) == 0


def test_sharing_but_too_few_decodes():
    tables, lens = shared_rows(CASCADE_MIN_DECODES - 1, 40, 2)
    assert common_prefix_blocks(tables, lens, BLOCK) == 40
    assert cascade_prefix_blocks(tables, lens, CASCADE_MIN_DECODES - 1, BLOCK) == 0
    tables, lens = shared_rows(CASCADE_MIN_DECODES, 40, 2)
    assert cascade_prefix_blocks(tables, lens, CASCADE_MIN_DECODES, BLOCK) == 40


def test_prefix_shorter_than_the_threshold():
    tables, lens = shared_rows(12, CASCADE_MIN_PREFIX_TOKENS // BLOCK - 1, 2)  # 240 tokens
    assert cascade_prefix_blocks(tables, lens, 12, BLOCK) == 0
    tables, lens = shared_rows(12, CASCADE_MIN_PREFIX_TOKENS // BLOCK, 2)  # exactly 256 tokens
    assert cascade_prefix_blocks(tables, lens, 12, BLOCK) == CASCADE_MIN_PREFIX_TOKENS // BLOCK


@pytest.mark.parametrize("shortest,expected", [(20 * BLOCK, 19), (20 * BLOCK + 1, 20), (20 * BLOCK - 1, 19),
                                               (30 * BLOCK + 7, 25), (1, 0)])
def test_prefix_capped_below_the_shortest_context(shortest, expected):
    """Every sequence keeps at least one token after the prefix (here all 25 blocks are shared, e.g. one
    sequence's whole context is a cached prompt), so prefix tokens < the shortest context length."""
    tables, lens = shared_rows(8, 25, 6)
    lens[3] = shortest
    n = common_prefix_blocks(tables, lens, BLOCK)
    assert n == expected and n * BLOCK < shortest


@pytest.mark.parametrize("block_size", [8, 16, 32, 64])
def test_prefix_is_whole_blocks_of_any_size(block_size):
    """The result counts blocks; shared tokens that do not fill a block of every sequence never count."""
    num_shared = -(-CASCADE_MIN_PREFIX_TOKENS // block_size) + 1
    tables, lens = shared_rows(8, num_shared, 2, block_size)
    lens[0] = num_shared * block_size  # this context ends exactly at the shared run's end
    n = cascade_prefix_blocks(tables, lens, 8, block_size)
    assert n == num_shared - 1 and n * block_size >= CASCADE_MIN_PREFIX_TOKENS and n * block_size < lens[0]


def test_only_the_decode_rows_count():
    """Prefill chunks after the decodes neither need nor break the shared prefix."""
    tables, lens = shared_rows(10, 20, 2)
    tables[8:] = 9  # rows 8 and 9 are prefill chunks with their own blocks
    assert cascade_prefix_blocks(tables, lens, 8, BLOCK) == 20
    assert cascade_prefix_blocks(tables, lens, 10, BLOCK) == 0


def test_empty_and_single_row():
    assert common_prefix_blocks(np.zeros((0, 4), dtype=np.int32), [], BLOCK) == 0
    assert common_prefix_blocks(tables_for([[3, 4, 5]]), [40], BLOCK) == 2


def decode(rid: str, context_len: int, table: list[int]) -> ScheduledRequest:
    request = Request(rid, [1] * context_len, SamplingParams(max_tokens=4), max_tokens=4)
    return ScheduledRequest(request, [5], context_len - 1, table, True)


def test_build_inputs_carries_the_prefix_only_with_cascade():
    shared = list(range(40, 58))  # 18 blocks = 288 tokens
    scheduled = [decode(f"d{s}", 18 * BLOCK + 1 + s, shared + [100 + s]) for s in range(9)]
    prompt = Request("p", [1] * 30, SamplingParams(max_tokens=4), max_tokens=4)
    scheduled.append(ScheduledRequest(prompt, [2] * 30, 0, [7, 8], True))  # a fresh prompt, not shared
    out = SchedulerOutput(scheduled, num_batched_tokens=9 + 30)
    meta = build_inputs(out, BLOCK, torch.device("cpu"), cascade=True).meta
    assert meta.use_cascade and meta.num_decodes == 9
    assert meta.prefix_len.dtype == torch.int32 and meta.prefix_len.tolist() == [18 * BLOCK]
    assert meta.prefix_blocks.dtype == torch.int32 and meta.prefix_blocks.tolist() == shared
    assert meta.max_prefix_len == 18 * BLOCK
    plain = build_inputs(out, BLOCK, torch.device("cpu")).meta  # the CPU path: cascade never asked for
    assert not plain.use_cascade and plain.prefix_blocks is None and plain.max_prefix_len == 0
    few = SchedulerOutput(scheduled[:7], num_batched_tokens=7)
    assert not build_inputs(few, BLOCK, torch.device("cpu"), cascade=True).meta.use_cascade


def test_disable_cascade_attn_setting():
    """One name in Python, YAML and the CLI (`--disable-cascade-attn`); cascade is allowed by default."""
    import argparse

    from shared_engine.config import EngineConfig
    from shared_engine.entrypoints.openai.cli_args import add_serve_arguments, build_configs

    assert EngineConfig().model.disable_cascade_attn is False
    assert EngineConfig.from_flat(disable_cascade_attn=True).model.disable_cascade_attn is True
    assert EngineConfig().to_flat()["disable_cascade_attn"] is False
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert build_configs(parser.parse_args(["--disable-cascade-attn"]))[0].model.disable_cascade_attn is True
    assert build_configs(parser.parse_args([]))[0].model.disable_cascade_attn is False


def test_cpu_runner_never_cascades(tiny_model_dir):
    """The CPU path (torch backend) is unchanged: no cascade metadata, even with a shared prefix."""
    from shared_engine import LLM, SamplingParams

    llm = LLM(str(tiny_model_dir), load_format="dummy", block_size=8, max_model_len=512, device="cpu")
    runner = llm.engine.runner
    assert not runner.enable_cascade and runner.graph_runner is None
    prefix = list(range(3, 40)) * 8  # 296 tokens: 37 shared blocks of 8
    prompts = [{"prompt_token_ids": prefix + [50 + i]} for i in range(CASCADE_MIN_DECODES + 1)]
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert runner.cascade_steps == 0

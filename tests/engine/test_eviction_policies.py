"""Eviction policies on the block manager alone: LRU order, and the cost policy keeping a hot prefix that
LRU lets a burst of one-off prompts flush."""

from __future__ import annotations

import pytest

from shared_engine.core.block_manager import BlockManager
from shared_engine.core.request import Request
from shared_engine.sampling_params import SamplingParams

BS = 4


def serve(bm: BlockManager, rid: str, tokens: list[int]) -> int:
    """Admit, 'compute' and finish one request; returns its prefix-cache hit in tokens."""
    req = Request(rid, tokens, SamplingParams(max_tokens=1), max_tokens=1)
    cached = bm.find_cached_prefix(req)
    req.num_computed_tokens = len(cached) * BS
    bm.allocate(req, len(tokens) - req.num_computed_tokens, cached_blocks=cached)
    req.num_computed_tokens = len(tokens)
    bm.cache_computed_blocks(req)
    bm.free(req)
    bm.check_integrity()
    return len(cached) * BS


HOT = list(range(1000, 1016)) + [7]  # 4 full blocks + 1 token
def one_off(i: int) -> list[int]:
    return [2000 + 100 * i + j for j in range(13)]  # 3 full blocks + 1 token, never repeated


@pytest.mark.parametrize("policy, expected_hits", [("lru", 0), ("cost", 16)])
def test_hot_prefix_survives_a_burst_only_under_cost(policy, expected_hits):
    bm = BlockManager(10, BS, enable_prefix_caching=True, eviction=policy)
    serve(bm, "warm0", HOT)
    for i in range(4):  # the hot prefix (a shared system prompt) is reused a few times
        assert serve(bm, f"warm{i + 1}", HOT[:-1] + [8 + i]) == 16
    for i in range(3):  # a burst of one-off prompts under KV pressure (pool of 10 blocks)
        serve(bm, f"burst{i}", one_off(i))
    assert serve(bm, "hot", HOT[:-1] + [20]) == expected_hits


def test_lru_evicts_the_deepest_block_of_a_chain_first():
    bm = BlockManager(6, BS, enable_prefix_caching=True, eviction="lru")
    serve(bm, "a", list(range(100, 117)))  # 4 full blocks + 1 partial
    serve(bm, "b", list(range(500, 509)))  # needs 3 blocks: 2 free (one was a's partial block) + 1 evicted
    assert serve(bm, "a2", list(range(100, 117))) == 12  # the chain lost only its deepest block


def test_cost_never_ranks_a_child_above_its_parent():
    from shared_engine.core.eviction import make_policy

    policy = make_policy("cost", block_size=16, attention_scale_tokens=64)
    policy.add_chain([(0, 0, 0), (1, 1, 5), (2, 2, 5)])  # children claim more hits than the root
    assert policy.evict() == 2 and policy.evict() == 1 and policy.evict() == 0

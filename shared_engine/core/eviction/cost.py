"""`cost`: keep what was reused often and is dear to recompute (GreedyDual-Size-Frequency, Cherkasova 1998,
HP Labs HPL-98-69R1, with every block the same size).

priority = L + (1 + num_hits) * recompute_cost(depth), where L is the priority of the last victim (an
inflation clock, so blocks that stop being hit age out) and recompute_cost grows with the block's position
(its tokens attend over a longer prefix), capped so that a child never outranks its parent. The victim has
the lowest priority; ties go to the oldest (within one chain, the deepest). A hot shared system prompt
accumulates hits and outlives a burst of one-off prompts, which plain LRU would let flush it.
"""

from __future__ import annotations

import heapq
import itertools

from shared_engine.core.eviction.registry import EvictionPolicy, register_policy


@register_policy("cost")
class CostAwareEviction(EvictionPolicy):
    def __init__(self, block_size: int = 16, attention_scale_tokens: int = 8192, **_) -> None:
        self.block_size = block_size
        # recompute cost of one block relative to a block at position 0: 1 + position / scale
        # (attention FLOPs grow linearly with position; the scale is where they match the MLP's, roughly
        # hidden-size * 2 tokens for Llama-style models).
        self.attention_scale_tokens = attention_scale_tokens
        self._heap: list[tuple[float, int, int]] = []
        self._live: dict[int, tuple[float, int, int]] = {}
        self._clock = 0.0
        self._seq = itertools.count()

    def add_chain(self, entries: list[tuple[int, int, int]]) -> None:
        priorities, cap = [], float("inf")
        for _block, depth, num_hits in entries:  # root first; a child never outranks its parent
            cost = 1.0 + depth * self.block_size / self.attention_scale_tokens
            cap = min(cap, self._clock + (1 + num_hits) * cost)
            priorities.append(cap)
        for (block, _depth, _hits), priority in reversed(list(zip(entries, priorities))):
            entry = (priority, next(self._seq), block)  # ties: older first; within a chain, deepest first
            self._live[block] = entry
            heapq.heappush(self._heap, entry)

    def remove(self, block: int) -> None:
        self._live.pop(block, None)  # its heap entry is skipped lazily

    def evict(self) -> int:
        while self._heap:
            entry = heapq.heappop(self._heap)
            block = entry[2]
            if self._live.get(block) is entry:
                del self._live[block]
                self._clock = entry[0]
                return block
        raise IndexError("no evictable block")

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, block: int) -> bool:
        return block in self._live

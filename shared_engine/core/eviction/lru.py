"""`lru`: least recently used first; blocks freed together go deepest first (vLLM's order), so a chain is
trimmed from its tail and its remaining prefix stays reachable."""

from __future__ import annotations

from collections import OrderedDict

from shared_engine.core.eviction.registry import EvictionPolicy, register_policy


@register_policy("lru")
class LRUEviction(EvictionPolicy):
    def __init__(self, **_) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def add_chain(self, entries: list[tuple[int, int, int]]) -> None:
        for block, _depth, _hits in reversed(entries):  # deepest first in line
            self._order[block] = None

    def remove(self, block: int) -> None:
        self._order.pop(block, None)

    def evict(self) -> int:
        block, _ = self._order.popitem(last=False)
        return block

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, block: int) -> bool:
        return block in self._order

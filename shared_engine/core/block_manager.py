"""`BlockManager`: the paged KV cache's bookkeeping (PagedAttention, Kwon et al. 2023,
https://arxiv.org/abs/2309.06180).

The KV pool is `num_blocks` fixed-size blocks of `block_size` tokens. Each request owns a block table: its
logical block i (token positions [i*block_size, (i+1)*block_size)) lives in physical block
`block_table[i]`. Blocks are allocated on demand as a sequence grows and returned when it ends. Every
block carries a reference count (how many block tables hold it) so that blocks can be shared between
requests (prefix caching) and reserved ahead (speculative lookahead slots).

Resources follow check/commit pairs: `can_allocate` → `allocate`, then `free`. `check_integrity()`
verifies the invariants; tests call it after every step.
"""

from __future__ import annotations

from collections import Counter, deque

from shared_engine.core.request import Request


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}

    # ---- queries -------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0-1 (the `vllm:kv_cache_usage_perc` gauge)."""
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, request: Request, num_new_tokens: int, num_lookahead_tokens: int = 0) -> int:
        """Blocks to add so that `num_computed_tokens + num_new_tokens (+ lookahead)` positions have slots."""
        needed = self.blocks_for_tokens(request.num_computed_tokens + num_new_tokens + num_lookahead_tokens)
        return max(0, needed - len(self.block_tables.get(request.request_id, ())))

    # ---- check / commit ------------------------------------------------------------------------------
    def can_allocate(self, request: Request, num_new_tokens: int, num_lookahead_tokens: int = 0) -> bool:
        return self.num_new_blocks(request, num_new_tokens, num_lookahead_tokens) <= len(self._free)

    def allocate(self, request: Request, num_new_tokens: int, num_lookahead_tokens: int = 0) -> list[int]:
        """Grow the request's block table to cover its next `num_new_tokens` tokens.

        Returns the newly allocated block ids. Raises `RuntimeError` when the pool cannot supply them
        (call `can_allocate` first).
        """
        count = self.num_new_blocks(request, num_new_tokens, num_lookahead_tokens)
        if count > len(self._free):
            raise RuntimeError(f"KV pool exhausted: need {count} blocks, {len(self._free)} free")
        table = self.block_tables.setdefault(request.request_id, [])
        new_blocks = [self._free.popleft() for _ in range(count)]
        for block in new_blocks:
            self.ref_counts[block] += 1
        table.extend(new_blocks)
        return new_blocks

    def free(self, request: Request) -> None:
        """Drop the request's references; blocks nobody else holds return to the free pool."""
        for block in reversed(self.block_tables.pop(request.request_id, [])):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free.append(block)

    def get_block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    # ---- invariants ----------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise `AssertionError` unless: every block is either free (reference count 0, in the free pool
        exactly once) or held (reference count == number of block tables holding it)."""
        held = Counter(block for table in self.block_tables.values() for block in table)
        free = Counter(self._free)
        assert all(c == 1 for c in free.values()), "a block is in the free pool twice"
        for block in range(self.num_blocks):
            refs = self.ref_counts[block]
            assert refs == held.get(block, 0), f"block {block}: ref_count {refs} != holders {held.get(block, 0)}"
            assert (refs == 0) == (block in free), f"block {block}: ref_count {refs} but free={block in free}"
        for request_id, table in self.block_tables.items():
            assert len(set(table)) == len(table), f"{request_id}: a block appears twice in its table"

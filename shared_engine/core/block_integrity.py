"""The block manager's invariants (`BlockManager.check_integrity`; tests call it after every step). Imports
no torch."""

from __future__ import annotations

from collections import Counter


def check_block_integrity(bm) -> None:
    """Raise `AssertionError` unless: each block's reference count equals the number of block tables and
    session pins holding it; every unreferenced block is in exactly one of the free pool (no cached KV) and
    the evictable set (cached KV); the hash index and the blocks' hashes agree; and the host tier (KV
    offload) holds every slot exactly once, free or by one hash."""
    held = Counter(block for table in bm.block_tables.values() for block in table)
    held.update(bm.pins.blocks())
    free = Counter(bm._free)
    assert all(c == 1 for c in free.values()), "a block is in the free pool twice"
    for block in range(bm.num_blocks):
        refs = bm.ref_counts[block]
        assert refs == held.get(block, 0), f"block {block}: ref_count {refs} != holders {held.get(block, 0)}"
        in_free, in_evictable = block in free, block in bm._evictable
        assert not (in_free and in_evictable), f"block {block} is both free and evictable"
        assert (refs == 0) == (in_free or in_evictable), f"block {block}: ref_count {refs}, free={in_free}"
        assert not in_free or bm._block_hash[block] is None, f"free block {block} still has a hash"
        assert not in_evictable or bm._block_hash[block] is not None, f"evictable block {block} has no hash"
        h = bm._block_hash[block]
        assert h is None or bm._cached.get(h) == block, f"block {block}: hash index disagrees"
    assert len(bm._cached) == sum(h is not None for h in bm._block_hash), "stale hash index entries"
    assert len(free) + len(bm._evictable) == bm.ref_counts.count(0)
    for request_id, table in bm.block_tables.items():
        assert len(set(table)) == len(table), f"{request_id}: a block appears twice in its table"
    if bm.host is not None:
        bm.host.check_integrity()

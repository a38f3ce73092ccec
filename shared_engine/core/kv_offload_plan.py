"""`KVOffloadPlan`: the block manager's side of KV offload (a mixin of `BlockManager`). Imports no torch.

It queues the copies of one step: `_offer_to_host` when the pool evicts a cached block to reuse it (GPU ->
host into the slot `HostKVTier.offer` gives), `_restore` when `allocate` takes a prefix hit that continues in
the host tier (a new GPU block per host block, registered in the prefix cache at once, host -> GPU).
`take_copies` hands them to the step's `SchedulerOutput`; the model runner runs the offloads, then the
restores, before the step's forward (model_executor/kv_offloader.py), which is what makes registering a
restored block before its bytes arrive safe.
"""

from __future__ import annotations


class KVOffloadPlan:
    """Mixin: needs the `BlockManager`'s `host`, `_offloads`, `_restores`, `_cached`, `_block_hash`,
    `_block_depth`, `_block_hits`, `ref_counts`, `_take_block` and the two `num_*_blocks_total` counters."""

    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The copies queued since the last call: `(offloads [(gpu block, host slot)], restores [(host slot,
        gpu block)])`, for the step being scheduled (run offloads first, both before its forward)."""
        copies = self._offloads, self._restores
        self._offloads, self._restores = [], []
        if self.host is not None:
            self.host.end_step()
        return copies

    @property
    def num_host_cached_blocks(self) -> int:
        return 0 if self.host is None else len(self.host)

    def _restore(self, table: list[int], host_hashes) -> None:
        """Give each host-tier hit (root first, after `table`'s GPU hit) a new GPU block, registered now."""
        slots = [self.host.claim(h) for h in host_hashes]  # before taking blocks: their offloads skip these
        for h, slot in zip(host_hashes, slots):
            block = self._take_block()
            self.ref_counts[block] += 1
            if h not in self._cached:
                self._cached[h] = block
                self._block_hash[block] = h
                self._block_depth[block] = len(table)
            self._block_hits[block] += 1
            table.append(block)
            self._restores.append((slot, block))
        self.num_restored_blocks_total += len(slots)

    def _offer_to_host(self, block: int) -> None:
        """The pool evicts cached `block` to reuse it: queue its GPU -> host copy unless the host tier has
        it already or has no slot free this step."""
        h = self._block_hash[block]
        slot = self.host.offer(h) if h is not None and self._cached.get(h) == block else None
        if slot is not None:
            self._offloads.append((block, slot))
            self.num_offloaded_blocks_total += 1

"""`HostKVTier`: the index of KV blocks offloaded to host memory (`--kv-offload-size`), least recently used
first. Imports no torch: it holds only which block hash lives in which host slot; the model runner's
`KVOffloader` owns the pinned buffer and moves the bytes.

A cached, unreferenced GPU block that the pool evicts is offered here (`offer`): it takes a free slot, or the
slot of the least recently used entry, and the caller schedules a GPU -> host copy into it. A prefix lookup
that misses on the GPU continues here (`get`); a hit schedules a host -> GPU copy. The host copy stays
(inclusive): if that block is evicted from the GPU again, no second copy is needed.

Within one step copies run offloads first, then restores (`SchedulerOutput.kv_offloads`, `kv_restores`), so a
slot that a step reads (a restore) or writes (an offload) must not be handed to another block in the same
step: such slots are `busy` until `end_step`. An offer finding every slot busy is dropped (offload is
best-effort: the block is recomputed on its next use).
"""

from __future__ import annotations

from collections import OrderedDict

from shared_engine.core.block_hash import BlockHash


class HostKVTier:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self._slots: OrderedDict[BlockHash, int] = OrderedDict()  # least recently used first
        self._free = list(range(num_blocks - 1, -1, -1))  # popped from the end: slot 0 first
        self._busy: set[int] = set()

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, block_hash: BlockHash) -> bool:
        return block_hash in self._slots

    def get(self, block_hash: BlockHash) -> int | None:
        """The host slot holding `block_hash`, or None (no side effects)."""
        return self._slots.get(block_hash)

    def claim(self, block_hash: BlockHash) -> int:
        """A restore reads `block_hash`'s slot this step: mark it most recently used and busy. Raises
        `KeyError` when it is not here."""
        slot = self._slots[block_hash]
        self._slots.move_to_end(block_hash)
        self._busy.add(slot)
        return slot

    def offer(self, block_hash: BlockHash) -> int | None:
        """A GPU block holding `block_hash` is being evicted. Returns the slot to copy it into, or None when
        no copy is needed (already here: touched instead) or none is possible (every slot busy this step)."""
        if block_hash in self._slots:
            self._slots.move_to_end(block_hash)
            return None
        if self._free:
            slot = self._free.pop()
        else:
            victim = next((h for h, s in self._slots.items() if s not in self._busy), None)
            if victim is None:
                return None
            slot = self._slots.pop(victim)
        self._slots[block_hash] = slot
        self._busy.add(slot)
        return slot

    def end_step(self) -> None:
        """The step's copies were handed to the model runner (they run before anything it enqueues later)."""
        self._busy.clear()

    def clear(self) -> None:
        """Forget every entry (a weight or adapter change made them stale)."""
        self._free.extend(reversed(sorted(self._slots.values())))
        self._slots.clear()

    def check_integrity(self) -> None:
        """Raise `AssertionError` unless every slot is exactly once either free or held by one hash (no
        leaked host blocks) and busy slots are held."""
        held = list(self._slots.values())
        assert len(set(held)) == len(held), "a host slot is held by two hashes"
        assert not set(held) & set(self._free), "a host slot is both free and held"
        assert len(set(self._free)) == len(self._free), "a host slot is free twice"
        assert len(held) + len(self._free) == self.num_blocks, (
            f"host tier leaked slots: {len(held)} held + {len(self._free)} free != {self.num_blocks}")
        assert self._busy <= set(held), "a busy host slot is not held"

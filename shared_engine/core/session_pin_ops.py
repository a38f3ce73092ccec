"""`SessionPinOps`: the block manager's side of session pins (a mixin of `BlockManager`; the pins themselves,
which session holds which blocks, are `SessionPins`). Imports no torch.

`free(request, now)` of a finished turn with a `session_id` pins its cached prefix blocks (one reference each,
`_pin_prefix`) for `pin_ttl` seconds of the caller's clock; `expire_pins(now)` releases the expired ones, the
session's next `allocate` releases its pin after taking its own references, and `release_oldest_pin` (or
`can_allocate_unpinning`) lets a caller with nothing running make room.
"""

from __future__ import annotations

from shared_engine.core.request import Request


class SessionPinOps:
    """Mixin: needs the `BlockManager`'s `pins`, `ref_counts`, `_block_hash`, `_drop_refs` and
    `can_allocate`."""

    def can_allocate_unpinning(self, request: Request, num_new_tokens: int, cached_blocks: list[int] = ()) -> bool:
        """`can_allocate`, releasing the oldest session pins while the pool is short (for a caller with
        nothing running, whom pins must not stall: time might not advance until something runs)."""
        while not self.can_allocate(request, num_new_tokens, cached_blocks=cached_blocks):
            if not self.release_oldest_pin():
                return False
        return True

    def expire_pins(self, now: float | None) -> None:
        """Release the session pins whose time-to-live ended at or before `now` (the caller's clock; None:
        no clock, nothing expires)."""
        if self.pins and now is not None:
            for blocks in self.pins.pop_expired(now):
                self._drop_refs(blocks)

    def release_oldest_pin(self) -> bool:
        """Release the oldest session pin (its blocks become evictable); False when there is none."""
        blocks = self.pins.pop_oldest()
        if blocks is not None:
            self._drop_refs(blocks)
        return blocks is not None

    @property
    def num_pinned_blocks(self) -> int:
        return self.pins.num_blocks

    def _pin_prefix(self, session_id: str, table: list[int], now: float) -> None:
        """One reference on each cached block of `table`'s prefix, pinned for the session until `now` + TTL;
        the pins this displaces (the session's previous one, the oldest over the cap) are released."""
        prefix = []
        for block in table:
            if self._block_hash[block] is None:
                break
            prefix.append(block)
            self.ref_counts[block] += 1
        for blocks in self.pins.add(session_id, now + self.pins.ttl, prefix):
            self._drop_refs(blocks)

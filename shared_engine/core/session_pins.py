"""`SessionPins`: time-to-live pins on the prefix blocks of a session's last finished turn (the paper
"Continuum: Efficient and Robust Multi-Turn LLM Agent Scheduling with KV Cache Time-to-Live").
Imports no torch; never reads a clock (times come from the caller).

An agent's turn ends, a tool runs for seconds, and the next turn resends the whole session plus a little.
Plain LRU evicts the session's KV exactly during that pause. A pin holds one reference on each cached
prefix block of the finished turn (so the block is neither free nor evictable) until `expiry` (the finish
time + `session_pin_ttl` seconds), or until the session's next turn takes its own references (unpin), or
until the cap on pinned block references (`max_pinned_blocks`) makes room for a newer pin (oldest first).
The block manager owns the reference counts; this holds only which session pins which blocks, oldest first.
"""

from __future__ import annotations

from collections import OrderedDict


class SessionPins:
    def __init__(self, ttl: float, max_blocks: int) -> None:
        self.ttl = ttl  # seconds; 0: pinning off
        self.max_blocks = max_blocks
        self._pins: OrderedDict[str, tuple[float, list[int]]] = OrderedDict()
        self.num_blocks = 0  # block references held by pins (a block pinned by two sessions counts twice)

    def __bool__(self) -> bool:
        return bool(self._pins)

    def add(self, session_id: str, expiry: float, blocks: list[int]) -> list[list[int]]:
        """Pin `blocks` (root first) for the session until `expiry`; returns the block lists this releases:
        the session's previous pin, then the oldest pins while over the cap (possibly this one's tail)."""
        released = []
        old = self.pop(session_id)
        if old is not None:
            released.append(old)
        if len(blocks) > self.max_blocks:
            released.append(blocks[self.max_blocks:])
            blocks = blocks[:self.max_blocks]
        while self._pins and self.num_blocks + len(blocks) > self.max_blocks:
            released.append(self.pop_oldest())
        if blocks:
            self._pins[session_id] = (expiry, blocks)
            self.num_blocks += len(blocks)
        return released

    def pop(self, session_id: str) -> list[int] | None:
        entry = self._pins.pop(session_id, None)
        if entry is None:
            return None
        self.num_blocks -= len(entry[1])
        return entry[1]

    def pop_oldest(self) -> list[int] | None:
        if not self._pins:
            return None
        return self.pop(next(iter(self._pins)))

    def pop_expired(self, now: float) -> list[list[int]]:
        """Pins whose expiry is at or before `now` (seconds, the caller's clock)."""
        expired = [sid for sid, (expiry, _) in self._pins.items() if expiry <= now]
        return [self.pop(sid) for sid in expired]

    def blocks(self):
        """Every pinned block reference (for the integrity check)."""
        for _expiry, blocks in self._pins.values():
            yield from blocks

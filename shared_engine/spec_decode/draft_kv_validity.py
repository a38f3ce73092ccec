"""`DraftKVValidity`: where the draft model's KV cache (spec_decode/draft_model_runner.py) is valid, by block.

The draft's cache shares the target's block ids, but not every target step writes the draft's KV:

- a speculative step of decodes only (`deferrable`, `on_owed`) is not run through the draft after the target.
  Its rows are *pending*: each request's draft KV from the row's first position on is owed. The request's
  next proposal pays it in its first draft step, which feeds the verified tokens from that position on
  together with the last one (`first_position`), so the draft computes them in the forward that also drafts
  its first token (no forward of its own, as EAGLE's and vLLM's draft-model runners do). A pending row lives
  one step: if the request's next proposal did not take it (no drafts for it, speculation off, finished,
  preempted), its blocks become stale (`settle`, `release`);
- a step of plain decodes only (speculation off, `on_plain_decodes`) is not run either: its blocks are stale;
- stale blocks (`stale_blocks`) hold draft KV that may be wrong: blocks of plain decodes, of pending rows
  nobody took, and every block a request writes after one of its own stale blocks (its draft KV there saw a
  stale context). Before a request's first draft step reads its cache, the draft recomputes it from its first
  stale block on (`first_position` returns that position; the runner's catch-up or first step computes it),
  also through prefix-cache hits on blocks computed while speculation was off.

So a proposal always reads valid draft KV. A block is valid for the positions below its request's computed
length; rejected drafts' slots are rewritten later, like the target's. Host bookkeeping only (no torch).
"""

from __future__ import annotations

from collections.abc import Iterable


def deferrable(scheduled: Iterable) -> bool:
    """Whether a step's draft KV need not be computed now: every row a decode (one token, or the last verified
    token and its drafts); a step with a prompt chunk of more than one token is mirrored at once."""
    return all(item.num_new_tokens == 1 or item.num_draft_tokens > 0 for item in scheduled)


class DraftKVValidity:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.stale_blocks: set[int] = set()  # block ids whose draft KV may be wrong
        # request id -> (first position whose draft KV is owed, the block ids its row wrote from there)
        self.pending: dict[str, tuple[int, list[int]]] = {}

    def settle(self) -> None:
        """Pending rows that no proposal took since the last step: their blocks are stale."""
        for _, blocks in self.pending.values():
            self.stale_blocks.update(blocks)
        self.pending.clear()

    def on_mirrored(self, scheduled: list) -> None:
        """A target step (`ScheduledRequest`s) the draft runs now: the previous step's leftover owed rows
        settled, then what each row writes is stale when one of its request's blocks before it is, else valid."""
        self.settle()
        self._follow(scheduled)

    def on_owed(self, scheduled: list) -> None:
        """A speculative step of decodes the draft does not run: as `on_mirrored`, but each row is owed to its
        request's next proposal (pending) rather than valid."""
        self.settle()
        self._follow(scheduled)
        bs = self.block_size
        for item in scheduled:
            start = item.start_position
            self.pending[item.request_id] = (start, item.block_table[start // bs:(item.context_len - 1) // bs + 1])

    def on_plain_decodes(self, scheduled: list) -> None:
        """A step of plain decodes (speculation off): each row's block is stale at once (O(rows): no scan of
        the tables, since every step of the request while speculation is off marks its block)."""
        self.settle()
        for item in scheduled:
            self.stale_blocks.add(item.block_table[item.start_position // self.block_size])

    def _follow(self, scheduled: list) -> None:
        bs, stale = self.block_size, self.stale_blocks
        if not stale:
            return
        for item in scheduled:
            table, first = item.block_table, item.start_position // bs
            written = table[first:(item.context_len - 1) // bs + 1]
            # the block the row starts in counts unless the row starts it (a fresh block: what a previous
            # owner left there is overwritten from its first slot)
            before = table[:first + (item.start_position % bs > 0)]
            if any(b in stale for b in before):
                stale.update(written)
            else:
                stale.difference_update(written)

    def first_position(self, request_id: str, table: list[int], num_computed: int) -> int:
        """The first position below or at `num_computed` whose draft KV the request's next draft step must
        compute (`num_computed` itself when only its last token is new): its pending row's start, or its first
        stale block's, whichever comes first. Takes the pending row."""
        start = num_computed
        entry = self.pending.pop(request_id, None)
        if entry is not None:
            position, blocks = entry
            first = position // self.block_size
            if table[first:first + len(blocks)] == blocks:
                start = min(start, position)
            else:  # not the blocks its row wrote (never expected): recompute from there on
                self.stale_blocks.update(blocks)
                self.stale_blocks.update(table[first:-(-num_computed // self.block_size)])
        stale = self.first_stale_position(table, num_computed)
        return start if stale is None else min(start, stale)

    def first_stale_position(self, table: list[int], num_tokens: int) -> int | None:
        """The first position (a block start) below `num_tokens` whose draft KV may be stale, or None."""
        for i, block in enumerate(table[:-(-num_tokens // self.block_size)]):
            if block in self.stale_blocks:
                return i * self.block_size
        return None

    def computed(self, table: list[int], start: int, end: int) -> None:
        """The draft recomputed positions [start, end) of a request whose draft KV is valid before `start`:
        the blocks they lie in are valid again."""
        if end > start:
            self.stale_blocks.difference_update(table[start // self.block_size:(end - 1) // self.block_size + 1])

    def release(self, request_id: str) -> None:
        """A finished or aborted request: a pending row of it is never taken (its blocks may be in the prefix
        cache), so they are stale now."""
        entry = self.pending.pop(request_id, None)
        if entry is not None:
            self.stale_blocks.update(entry[1])

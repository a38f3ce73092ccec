"""`BlockManager`: the paged KV cache's bookkeeping (PagedAttention, Kwon et al. 2023,
https://arxiv.org/abs/2309.06180), with automatic prefix caching.

The KV pool is `num_blocks` fixed-size blocks of `block_size` tokens. Each request owns a block table: its
logical block i (token positions [i*block_size, (i+1)*block_size)) lives in physical block
`block_table[i]`. Blocks are allocated on demand as a sequence grows and dropped when it ends. Every block
carries a reference count (how many block tables hold it), so blocks can be shared between requests.

Prefix caching rules:
- Only full blocks are shared. A block is registered under its chained hash (`block_hash.py`) once all of
  its tokens' KV has been computed; a partially filled block is never shared.
- A shared block is never written: a request writes only positions at or after its `num_computed_tokens`,
  and a prefix hit always ends on a block boundary before them.
- A lookup never covers the last token of the request, so at least one token is computed and produces
  logits (`(num_tokens - 1) // block_size` full blocks at most).
- A block whose reference count falls to 0 keeps its KV and its hash: it is *evictable*, counted as free,
  and goes back to a request that hits it, or to the eviction policy (`eviction/`) when the pool needs
  space. Blocks with no cached KV are handed out first.
- While a request is computing a prefix block, other requests waiting on the same block hash are held
  back (`is_prefix_pending`), so requests with the same uncached prefix never compute it twice at once
  and reuse it as soon as it is complete.

Session pins (`session_pin_ops.py`, `session_pins.py`): a finished turn of a session keeps a reference on its
cached prefix blocks until a time-to-live ends or the session's next turn takes its own. KV offload
(`kv_offload_plan.py`, `host_kv_tier.py`, `num_host_blocks` > 0): evicted cached blocks go to a host tier,
a lookup that misses on the GPU continues there, and a step's copies travel in its `SchedulerOutput`.

Resources follow check/commit pairs: `can_allocate` → `allocate`, then `free`. `check_integrity()`
verifies the invariants; tests call it after every step.
"""

from __future__ import annotations

from collections import deque

from shared_engine.core.block_hash import HASH_FUNCTIONS, ROOT, BlockHash, extra_keys_for, hash_block
from shared_engine.core.block_integrity import check_block_integrity
from shared_engine.core.cached_prefix import CachedPrefix, num_host_hits
from shared_engine.core.eviction import make_policy
from shared_engine.core.host_kv_tier import HostKVTier
from shared_engine.core.kv_offload_plan import KVOffloadPlan
from shared_engine.core.request import Request
from shared_engine.core.session_pin_ops import SessionPinOps
from shared_engine.core.session_pins import SessionPins


class BlockManager(SessionPinOps, KVOffloadPlan):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 eviction: str = "lru", hash_algo: str = "sha256", pin_ttl: float = 0.0,
                 max_pinned_blocks: int | None = None, num_host_blocks: int = 0) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_tables: dict[str, list[int]] = {}
        self._free: deque[int] = deque(range(num_blocks))  # reference count 0, no cached KV
        self._evictable = make_policy(eviction, block_size=block_size)  # reference count 0, cached KV
        self._hash_fn = HASH_FUNCTIONS[hash_algo]
        self._block_hash: list[BlockHash | None] = [None] * num_blocks
        self._block_depth = [0] * num_blocks
        self._block_hits = [0] * num_blocks
        self._cached: dict[BlockHash, int] = {}
        self._request_hashes: dict[str, list[BlockHash]] = {}
        self._num_registered: dict[str, int] = {}
        self._pending: dict[BlockHash, str] = {}
        cap = num_blocks // 2 if max_pinned_blocks is None else max_pinned_blocks
        self.pins = SessionPins(pin_ttl if enable_prefix_caching else 0.0, cap)
        self.host = HostKVTier(num_host_blocks) if enable_prefix_caching and num_host_blocks > 0 else None
        self._offloads: list[tuple[int, int]] = []  # this step's (gpu block, host slot) copies
        self._restores: list[tuple[int, int]] = []  # this step's (host slot, gpu block) copies
        self.num_offloaded_blocks_total = 0
        self.num_restored_blocks_total = 0

    @classmethod
    def from_config(cls, num_blocks: int, cache, num_host_blocks: int = 0) -> BlockManager:
        """The pool for a `CacheConfig` (`session_pin_ttl`, `max_pinned_blocks` included) with a host tier of
        `num_host_blocks` (`CacheConfig.num_host_blocks`)."""
        return cls(num_blocks, cache.block_size, cache.enable_prefix_caching, cache.prefix_cache_eviction,
                   cache.prefix_caching_hash_algo, cache.session_pin_ttl, cache.max_pinned_blocks, num_host_blocks)

    # ---- queries -------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks available to new allocations: never-used or released ones plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests, 0-1 (the `vllm:kv_cache_usage_perc` gauge)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_for_tokens(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def num_new_blocks(self, request: Request, num_new_tokens: int, num_lookahead_tokens: int = 0) -> int:
        """Blocks to add so that `num_computed_tokens + num_new_tokens (+ lookahead)` positions have slots."""
        needed = -(-(request.num_computed_tokens + num_new_tokens + num_lookahead_tokens) // self.block_size)
        held = len(self.block_tables.get(request.request_id, ()))
        return needed - held if needed > held else 0

    def get_block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    # ---- prefix cache lookup -------------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> CachedPrefix:
        """The longest chain of cached full blocks matching the request's tokens: on the GPU, then continued
        in the host tier (without side effects)."""
        if not self.enable_prefix_caching or request.sampling_params.prompt_logprobs is not None:
            return CachedPrefix()
        hashes = self._hashes(request, (request.num_tokens - 1) // self.block_size)
        blocks = CachedPrefix()
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            blocks.append(block)
        if self.host is not None:
            for h in hashes[len(blocks):]:
                if h not in self.host:
                    break
                blocks.host_hashes.append(h)
        return blocks

    def num_revived(self, cached_blocks) -> int:
        """Free blocks a prefix hit takes: its evictable GPU blocks and one per host-tier block."""
        return sum(1 for b in cached_blocks if self.ref_counts[b] == 0) + num_host_hits(cached_blocks)

    def is_prefix_pending(self, request: Request, num_cached_blocks: int) -> bool:
        """True when the request's next uncached block is being computed right now by another request."""
        if not self._pending:
            return False
        hashes = self._hashes(request, (request.num_tokens - 1) // self.block_size)
        if num_cached_blocks >= len(hashes):
            return False
        owner = self._pending.get(hashes[num_cached_blocks])
        return owner is not None and owner != request.request_id

    # ---- check / commit ------------------------------------------------------------------------------
    def can_allocate(self, request: Request, num_new_tokens: int, num_lookahead_tokens: int = 0,
                     cached_blocks: list[int] = ()) -> bool:
        num_cached = len(cached_blocks) + num_host_hits(cached_blocks)
        new = self._blocks_needed(request, num_new_tokens, num_lookahead_tokens, num_cached)
        return new + self.num_revived(cached_blocks) <= self.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int, num_lookahead_tokens: int = 0,
                 cached_blocks: list[int] = ()) -> list[int]:
        """Grow the request's block table to cover its next `num_new_tokens` tokens (after `cached_blocks`,
        a prefix hit from `find_cached_prefix` that this call takes a reference on; its host-tier blocks
        get new GPU blocks and queued restores).

        Returns the newly allocated block ids. Raises `RuntimeError` when the pool cannot supply them
        (call `can_allocate` first).
        """
        if not self.can_allocate(request, num_new_tokens, num_lookahead_tokens, cached_blocks):
            raise RuntimeError(f"KV pool exhausted: {self.num_free_blocks} blocks free")
        rid = request.request_id
        table = self.block_tables.setdefault(rid, [])
        host_hashes = getattr(cached_blocks, "host_hashes", ())
        if cached_blocks or host_hashes:
            assert not table, "a prefix hit applies only to a request with no blocks"
            for block in cached_blocks:
                if self.ref_counts[block] == 0:
                    self._evictable.remove(block)
                self.ref_counts[block] += 1
                self._block_hits[block] += 1
            table.extend(cached_blocks)
            if host_hashes:
                self._restore(table, host_hashes)
            self._num_registered[rid] = len(table)
        count = self._blocks_needed(request, num_new_tokens, num_lookahead_tokens,
                                    len(cached_blocks) + len(host_hashes))
        new_blocks = [self._take_block() for _ in range(count)]
        for block in new_blocks:
            self.ref_counts[block] += 1
        table.extend(new_blocks)
        if self.enable_prefix_caching:
            self._mark_pending(request, len(table))
        if self.pins and request.session_id is not None:  # the session's next turn: its own references now
            self._drop_refs(self.pins.pop(request.session_id) or [])
        return new_blocks

    def cache_computed_blocks(self, request: Request) -> None:
        """Register the request's full blocks whose KV is now computed, so later requests can hit them."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        start = self._num_registered.get(rid, 0)
        num_full = request.num_computed_tokens // self.block_size
        if num_full <= start:
            return  # no block filled up since the last call: most decode steps
        table = self.block_tables.get(rid)
        if table is None:
            return
        num_full = min(num_full, len(table))
        if num_full <= start:
            return
        hashes = self._hashes(request, num_full)
        for depth in range(start, num_full):
            h, block = hashes[depth], table[depth]
            if self._pending.get(h) == rid:
                del self._pending[h]
            if h not in self._cached and self._block_hash[block] is None:
                self._cached[h] = block
                self._block_hash[block] = h
                self._block_depth[block] = depth
        self._num_registered[rid] = num_full

    def trim(self, request: Request, num_tokens: int) -> None:
        """Return the request's blocks past its first `num_tokens` positions (a speculative step's rejected
        lookahead slots). Such blocks hold no verified KV, so they were never registered or pending."""
        table = self.block_tables.get(request.request_id)
        keep = self.blocks_for_tokens(num_tokens)
        if table is None or len(table) <= keep:
            return
        for block in table[keep:]:
            assert self._block_hash[block] is None, "a lookahead block was registered in the prefix cache"
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self._free.appendleft(block)
        del table[keep:]

    def free(self, request: Request, now: float | None = None) -> None:
        """Drop the request's references. Blocks nobody holds become free, or evictable if cached. Given
        `now` (a finished turn; seconds, the caller's clock) and a `session_id`, pin first (module docstring)."""
        rid = request.request_id
        table = self.block_tables.pop(rid, [])
        if now is not None and self.pins.ttl > 0 and request.session_id is not None:
            self._pin_prefix(request.session_id, table, now)
        self._drop_refs(table)
        hashes = self._request_hashes.pop(rid, ())
        if self._pending:  # its pending entries are among its own hashes (`_mark_pending`): not a scan of all
            pending = self._pending
            for h in hashes:
                if pending.get(h) == rid:
                    del pending[h]
        self._num_registered.pop(rid, None)

    def reset_prefix_cache(self) -> None:
        """Forget every evictable cached block and the host tier (e.g. after a weight or adapter change);
        pins go first."""
        while self.release_oldest_pin():
            pass
        while len(self._evictable):
            self._free.append(self._uncache(self._evictable.evict()))
        if self.host is not None:
            self.host.clear()

    # ---- internals -----------------------------------------------------------------------------------
    def _drop_refs(self, table: list[int]) -> None:
        """One reference less on each block of `table` (root first); unheld ones become free or evictable."""
        released = []
        for block in table:
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                released.append(block)
        self._evictable.add_chain([(b, self._block_depth[b], self._block_hits[b])
                                   for b in released if self._block_hash[b] is not None])
        self._free.extend(b for b in reversed(released) if self._block_hash[b] is None)

    def _blocks_needed(self, request, num_new_tokens, num_lookahead_tokens, num_cached_blocks) -> int:
        computed = num_cached_blocks * self.block_size if num_cached_blocks else request.num_computed_tokens
        needed = self.blocks_for_tokens(computed + num_new_tokens + num_lookahead_tokens)
        held = num_cached_blocks or len(self.block_tables.get(request.request_id, ()))
        return max(0, needed - held)

    def _take_block(self) -> int:
        if self._free:
            return self._free.popleft()
        block = self._evictable.evict()
        if self.host is not None:
            self._offer_to_host(block)
        return self._uncache(block)

    def _uncache(self, block: int) -> int:
        h = self._block_hash[block]
        if h is not None and self._cached.get(h) == block:
            del self._cached[h]
        self._block_hash[block] = None
        self._block_hits[block] = 0
        return block

    def _hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        """Chained hashes of the request's first `num_blocks` full blocks (computed once, then extended). Read
        only: it may be the request's cached list itself."""
        hashes = self._request_hashes.setdefault(request.request_id, [])
        done = len(hashes)
        if done < num_blocks:
            bs = self.block_size
            tokens = tuple(request.token_ids_slice(done * bs, num_blocks * bs))  # its slices are the blocks' keys
            parent = hashes[-1] if hashes else ROOT
            extra = None if hashes else extra_keys_for(request.lora_name, request.lora_version,
                                                       request.cache_salt)
            for start in range(0, len(tokens), bs):
                parent = hash_block(self._hash_fn, parent, tokens[start:start + bs], extra)
                hashes.append(parent)
                extra = None  # extra keys go into the first block only
        # the list itself when it is exactly as long (callers only read it): no copy per lookup
        return hashes if len(hashes) == num_blocks else hashes[:num_blocks]

    def _mark_pending(self, request: Request, num_blocks: int) -> None:
        full = min(num_blocks, request.num_prompt_tokens // self.block_size)
        start = self._num_registered.get(request.request_id, 0)
        if full <= start:
            return
        for h in self._hashes(request, full)[start:]:
            if h not in self._cached:
                self._pending.setdefault(h, request.request_id)

    # ---- invariants ----------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise `AssertionError` unless the pool's invariants hold (`block_integrity.py`); tests call it
        after every step."""
        check_block_integrity(self)

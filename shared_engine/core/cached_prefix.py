"""`CachedPrefix`: what a prefix-cache lookup found (`BlockManager.find_cached_prefix`). Imports no torch."""

from __future__ import annotations

from shared_engine.core.block_hash import BlockHash


class CachedPrefix(list):
    """The hit's GPU blocks (the list itself, root first), then `host_hashes`: the hashes of the blocks that
    follow them in the host tier (`--kv-offload-size`), each restored into a new GPU block by a host -> GPU
    copy before the step's forward. `num_blocks` counts both; `len()` only the GPU blocks."""

    __slots__ = ("host_hashes",)

    def __init__(self, blocks=(), host_hashes: list[BlockHash] | None = None) -> None:
        super().__init__(blocks)
        self.host_hashes = host_hashes or []

    @property
    def num_blocks(self) -> int:
        return len(self) + len(self.host_hashes)


def num_host_hits(cached) -> int:
    """Host-tier blocks of a lookup result (0 for a plain list of GPU blocks)."""
    return len(getattr(cached, "host_hashes", ()))

"""`EvictionPolicy`: the set of evictable cached blocks and the order in which they go."""

from __future__ import annotations

from abc import ABC, abstractmethod

_POLICIES: dict[str, type[EvictionPolicy]] = {}


class EvictionPolicy(ABC):
    """Holds blocks whose reference count fell to 0 but whose KV is still cached (their hash is
    registered). `add` when a block becomes evictable, `remove` when a prefix hit revives it, `evict`
    to pick the victim when the pool needs a block."""

    @abstractmethod
    def add_chain(self, entries: list[tuple[int, int, int]]) -> None:
        """Blocks of one block table that just became evictable, root first: `(block, depth, num_hits)`,
        `depth` being the block's index in its chain (0 = first block of a prompt) and `num_hits` how many
        requests reused it from the cache. A policy must never rank a block above its own descendants in
        the same chain for keeping (evicting a parent strands its cached children)."""

    @abstractmethod
    def remove(self, block: int) -> None: ...

    @abstractmethod
    def evict(self) -> int:
        """Remove and return the victim. Raises `IndexError` when empty."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def __contains__(self, block: int) -> bool: ...


def register_policy(name: str):
    def wrap(cls):
        _POLICIES[name] = cls
        return cls

    return wrap


def make_policy(name: str, **kwargs) -> EvictionPolicy:
    """Raises `ValueError` for an unknown policy name."""
    from shared_engine.core.eviction import cost, lru  # noqa: F401  (register the built-ins)

    if name not in _POLICIES:
        raise ValueError(f"unknown prefix cache eviction policy {name!r}; available: {sorted(_POLICIES)}")
    return _POLICIES[name](**kwargs)

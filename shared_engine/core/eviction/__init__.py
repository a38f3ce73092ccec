"""Eviction policies for cached (reference count 0) blocks, behind a small registry."""

from shared_engine.core.eviction.registry import EvictionPolicy, make_policy

__all__ = ["EvictionPolicy", "make_policy"]

"""Proposers by `speculative_config.method` name."""

from __future__ import annotations

from collections.abc import Callable

from shared_engine.spec_decode.proposer import Proposer

_PROPOSERS: dict[str, Callable[..., Proposer]] = {}


def register_proposer(name: str):
    def wrap(factory):
        _PROPOSERS[name] = factory
        return factory

    return wrap


def proposer_names() -> set[str]:
    _register_builtins()
    return set(_PROPOSERS)


def build_proposer(config, **context) -> Proposer:
    """The proposer for a `SpeculativeConfig`; `context` carries what model-based proposers need (the
    engine config, the target model source and runner). Raises ValueError for an unknown method."""
    _register_builtins()
    if config.method not in _PROPOSERS:
        raise ValueError(f"unknown speculative method {config.method!r}; available: {sorted(_PROPOSERS)}")
    return _PROPOSERS[config.method](config, **context)


def _register_builtins() -> None:
    from shared_engine.spec_decode import (  # noqa: F401
        draft_model_proposer,
        ngram_proposer,
        replay_proposer,
        suffix_proposer,
    )

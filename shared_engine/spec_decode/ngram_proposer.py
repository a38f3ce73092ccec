"""`NgramProposer`: prompt lookup decoding (Saxena 2023, https://github.com/apoorvumang/prompt-lookup-decoding;
vLLM's `ngram` method): the tokens that followed the last earlier occurrence of the request's final n-gram."""

from __future__ import annotations

import numpy as np

from shared_engine.spec_decode.proposer import Proposer
from shared_engine.spec_decode.registry import register_proposer


@register_proposer("ngram")
class NgramProposer(Proposer):
    def __init__(self, config, **_context) -> None:
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose(self, requests: list, caps: list[int]) -> list[list[int]]:
        return [self.lookup(r.prompt_token_ids + r.output_token_ids, cap) if cap > 0 else []
                for r, cap in zip(requests, caps)]

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to `k` tokens after the most recent earlier match of the last n tokens, n from
        `prompt_lookup_max` down to `prompt_lookup_min` (the longest match wins); [] without a match."""
        length = len(tokens)
        if length <= self.min_n:
            return []
        ids = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            suffix = ids[length - n:]
            # candidate starts i < length - n whose window ids[i:i+n] equals the suffix
            starts = np.flatnonzero(ids[: length - n] == suffix[0])
            for i in starts[::-1]:
                if np.array_equal(ids[i:i + n], suffix):
                    return tokens[i + n: i + n + k]
        return []

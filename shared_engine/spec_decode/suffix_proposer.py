"""`SuffixProposer`: SuffixDecoding (Oliaro et al., NeurIPS 2025, https://arxiv.org/abs/2411.04975; vLLM and
ArcticInference's `suffix` method): drafts from suffix trees over the request's own tokens (prompt and
output so far) and over the outputs of recently finished requests.

Each step, for each request: the longest suffix of its tokens that occurred before (at most
`suffix_decoding_max_tree_depth` tokens) is looked up in both trees; from the matched node the draft follows
the most frequent continuation while its probability stays >= `suffix_decoding_min_token_prob`, for at most
min(k, max_spec_factor * match length) tokens (the adaptive draft length: short matches draft little). The
tree whose draft has the higher score (expected accepted tokens) wins. The global tree keeps the last
`suffix_decoding_max_cached_requests` finished requests' outputs.
"""

from __future__ import annotations

from collections import deque

from shared_engine.spec_decode.proposer import Proposer
from shared_engine.spec_decode.registry import register_proposer
from shared_engine.spec_decode.suffix_tree import SuffixTree


class _RequestTree:
    __slots__ = ("tree", "cursor", "num_inserted")

    def __init__(self, max_depth: int) -> None:
        self.tree = SuffixTree(max_depth)
        self.cursor = self.tree.new_cursor()
        self.num_inserted = 0


@register_proposer("suffix")
class SuffixProposer(Proposer):
    def __init__(self, config, **_context) -> None:
        self.max_depth = config.suffix_decoding_max_tree_depth
        self.min_prob = config.suffix_decoding_min_token_prob
        self.spec_factor = config.suffix_decoding_max_spec_factor
        self.max_cached = config.suffix_decoding_max_cached_requests
        self.global_tree = SuffixTree(self.max_depth)
        self._cached: deque[list[int]] = deque()
        self._trees: dict[str, _RequestTree] = {}

    def propose(self, requests: list, caps: list[int]) -> list[list[int]]:
        return [self._propose(r, cap) if cap > 0 else [] for r, cap in zip(requests, caps)]

    def _propose(self, request, cap: int) -> list[int]:
        tokens = request.prompt_token_ids + request.output_token_ids
        own = self._trees.get(request.request_id)
        if own is None:
            own = self._trees[request.request_id] = _RequestTree(self.max_depth)
        for token in tokens[own.num_inserted:]:
            own.cursor = own.tree.append(own.cursor, token)
        own.num_inserted = len(tokens)
        best, best_score = [], 0.0
        for tree in (own.tree, self.global_tree):
            node, length = tree.find(tokens)
            if node is None:
                continue
            limit = min(cap, max(1, int(self.spec_factor * length)))
            draft, score = SuffixTree.continuation(node, limit, self.min_prob)
            if score > best_score:
                best, best_score = draft, score
        return best

    def on_finished(self, request) -> None:
        if self.max_cached == 0 or not request.output_token_ids:
            return
        outputs = list(request.output_token_ids)
        self.global_tree.insert(outputs)
        self._cached.append(outputs)
        if len(self._cached) > self.max_cached:
            self.global_tree.remove(self._cached.popleft())

    def release(self, request_id: str) -> None:
        self._trees.pop(request_id, None)

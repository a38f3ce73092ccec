"""`SuffixTree`: a depth-bounded suffix trie with occurrence counts, built online (one token at a time).

Every window tokens[i : i + d] (d <= max_depth) of the inserted sequences is a path from the root; a node's
`count` is how many times its path occurred. Appending a token extends the nodes of the sequence's last
`max_depth` suffixes (its `active` list), O(max_depth) per token. A sequence can be removed again (counts
decremented, empty nodes dropped), which bounds the global tree over recent requests' outputs.
"""

from __future__ import annotations


class Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, Node] = {}
        self.count = 0


class SuffixTree:
    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = Node()

    def new_cursor(self) -> list[Node]:
        """An insertion cursor: the nodes of the inserted sequence's current suffixes (shortest last)."""
        return []

    def append(self, cursor: list[Node], token: int, delta: int = 1) -> list[Node]:
        """Extend every suffix in `cursor` (and the empty one) by `token`, adding `delta` to each count."""
        extended = []
        for node in [*cursor[-(self.max_depth - 1):], self.root] if self.max_depth > 1 else [self.root]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = Node()
            child.count += delta
            extended.append(child)
        return extended

    def insert(self, tokens: list[int]) -> None:
        cursor = self.new_cursor()
        for token in tokens:
            cursor = self.append(cursor, token)

    def remove(self, tokens: list[int]) -> None:
        """Undo `insert(tokens)`."""
        for start in range(len(tokens)):
            node = self.root
            path = []
            for token in tokens[start:start + self.max_depth]:
                child = node.children[token]
                child.count -= 1
                path.append((node, token, child))
                node = child
            for parent, token, child in path:
                if child.count == 0:
                    del parent.children[token]
                    break

    def find(self, context: list[int]) -> tuple[Node | None, int]:
        """The node of the longest suffix of `context` (at most `max_depth - 1` tokens, so a continuation
        can follow) that has continuations in the tree, and its length; (None, 0) when there is none."""
        longest = min(len(context), self.max_depth - 1)
        for length in range(longest, 0, -1):
            node = self.root
            for token in context[len(context) - length:]:
                node = node.children.get(token)
                if node is None:
                    break
            if node is not None and node.children:
                return node, length
        return None, 0

    @staticmethod
    def continuation(node: Node, max_tokens: int, min_prob: float,
                     exclude_count: int = 0) -> tuple[list[int], float]:
        """Follow the most frequent child while the path's probability (product of child count / sum of
        children counts) stays >= `min_prob`. Returns the tokens and the sum of their path probabilities
        (SuffixDecoding's score: the expected number of accepted tokens)."""
        tokens, prob, score = [], 1.0, 0.0
        while len(tokens) < max_tokens and node.children:
            total = sum(c.count for c in node.children.values())
            token, child = max(node.children.items(), key=lambda item: item[1].count)
            prob *= child.count / total
            if prob < min_prob:
                break
            tokens.append(token)
            score += prob
            node = child
        return tokens, score

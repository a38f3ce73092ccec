"""Proposers without a model: n-gram lookup, the suffix tree (counts, removal, the `min_token_prob` cutoff on
a path's probability) and the suffix proposer's two trees."""

from __future__ import annotations

import pytest

from shared_engine.config.speculative_config import SpeculativeConfig
from shared_engine.core.request import Request
from shared_engine.sampling_params import SamplingParams
from shared_engine.spec_decode.ngram_proposer import NgramProposer
from shared_engine.spec_decode.registry import build_proposer, proposer_names
from shared_engine.spec_decode.suffix_tree import SuffixTree


def _request(rid: str, prompt: list[int], output: list[int] = ()) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=64), max_tokens=64, output_token_ids=list(output))


def test_ngram_takes_the_longest_most_recent_match():
    p = NgramProposer(SpeculativeConfig(prompt_lookup_min=2, prompt_lookup_max=3))
    #                   [1 2 3] 9 ... [1 2 3] 7 8 ... 1 2 3
    assert p.lookup([1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 4, 1, 2, 3], 2) == [7, 8]
    assert p.lookup([5, 1, 2, 6, 6, 1, 2], 3) == [6, 6, 1]  # n = 2 when no 3-gram matches
    assert p.lookup([1, 2, 3, 4], 3) == []  # no repeat: no draft
    assert p.lookup([4, 4], 3) == []  # shorter than prompt_lookup_min + 1


def test_suffix_tree_counts_and_removal():
    tree = SuffixTree(max_depth=4)
    tree.insert([1, 2, 3, 1, 2, 4])
    node, length = tree.find([9, 1, 2])
    assert length == 2 and {t: c.count for t, c in node.children.items()} == {3: 1, 4: 1}
    assert SuffixTree.continuation(node, 3, 0.1)[0] == [3, 1]  # ties: first child; depth 4 ends the path
    tree.remove([1, 2, 3, 1, 2, 4])
    assert tree.root.children == {}


def test_suffix_proposer_drafts_from_its_own_tokens_and_from_finished_requests():
    config = SpeculativeConfig(method="suffix", num_speculative_tokens=4, suffix_decoding_max_cached_requests=1,
                               suffix_decoding_min_token_prob=0.1)
    proposer = build_proposer(config)
    code = [10, 11, 12, 13, 14, 15, 16, 17]
    own = _request("a", code + [0] + code[:3])
    assert proposer.propose([own], [4]) == [[13, 14, 15]]  # match length 3 caps the draft at 3 (factor 1)
    assert proposer.propose([own], [2]) == [[13, 14]]  # and k caps it
    done = _request("b", [1], [20, 21, 22, 23, 24, 25])
    proposer.on_finished(done)
    fresh = _request("c", [5, 20, 21, 22])
    assert proposer.propose([fresh], [4]) == [[23, 24, 25]]  # from the global tree
    proposer.on_finished(_request("d", [1], [30, 31]))  # max_cached_requests=1: "b" is forgotten
    assert proposer.propose([_request("e", [5, 20, 21, 22])], [4]) == [[]]


@pytest.mark.parametrize("min_prob,expected", [(0.8, []), (0.75, [1]), (0.6, [1]), (0.5, [1, 2]),
                                               (0.3, [1, 2])])
def test_suffix_tree_min_token_prob_cuts_the_path_probability(min_prob, expected):
    """After [7]: 1 three times in four (0.75), then after [7, 1]: 2 twice in three, so the path [1, 2] has
    probability 0.75 * 2/3 = 0.5 although each step's own share is >= 2/3. The draft keeps a token while the
    path's probability is >= min_prob and stops at the first one below it."""
    tree = SuffixTree(max_depth=4)
    for seq in ([7, 1, 2], [7, 1, 2], [7, 1, 3], [7, 4, 5]):
        tree.insert(seq)
    node, length = tree.find([9, 7])
    assert length == 1
    tokens, score = SuffixTree.continuation(node, 5, min_prob)
    assert tokens == expected
    assert score == pytest.approx(sum([0.75, 0.5][:len(expected)]))  # the expected accepted tokens


@pytest.mark.parametrize("min_prob,expected", [(0.9, [3]), (0.7, [3]), (2 / 3, [3, 4, 5, 0]), (0.6, [3, 4, 5, 0])])
def test_suffix_proposer_stops_the_draft_below_min_token_prob(min_prob, expected):
    """The request's own tokens A 0 A 0 A 0 B 0 1 2 (A = 1 2 3 4 5, B = 1 2 3 9): its longest suffix with a
    continuation, "0 1 2", was followed by 3 three times (probability 1), then by 4 twice and 9 once (2/3), then
    by 5 and 0 always (still 2/3). A cutoff above 2/3 drafts [3] only; at or below it the draft runs on to k."""
    config = SpeculativeConfig(method="suffix", num_speculative_tokens=4, suffix_decoding_max_cached_requests=0,
                               suffix_decoding_max_spec_factor=4.0, suffix_decoding_min_token_prob=min_prob)
    proposer = build_proposer(config)
    a, b = [1, 2, 3, 4, 5], [1, 2, 3, 9]
    request = _request("r", a + [0] + a + [0] + a + [0] + b + [0] + [1, 2])
    assert proposer.propose([request], [4]) == [expected]


def test_config_validation():
    assert {"ngram", "suffix"} <= proposer_names()
    with pytest.raises(ValueError, match="speculative_config.method"):
        SpeculativeConfig(method="nope")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig(num_speculative_tokens=0)
    with pytest.raises(ValueError, match="unknown key"):
        SpeculativeConfig.parse('{"method": "ngram", "k": 3}')
    with pytest.raises(ValueError, match="not valid JSON"):
        SpeculativeConfig.parse("{method")
    assert SpeculativeConfig.parse('{"method": "suffix", "num_speculative_tokens": 5}').k == 5


def test_speculative_config_flag():
    import argparse

    from shared_engine.entrypoints.openai.cli_args import add_serve_arguments, build_configs

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--speculative-config", '{"method": "suffix", "num_speculative_tokens": 4}'])
    engine, _ = build_configs(args)
    assert (engine.speculative_config.method, engine.speculative_config.k) == ("suffix", 4)
    assert build_configs(parser.parse_args([]))[0].speculative_config is None

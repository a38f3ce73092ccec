"""Speculative decoding changes nothing but speed: greedy outputs (token ids, text, finish reasons, stop
reasons, logprobs, token counts) equal speculation off for n-gram and suffix drafting and for the default model
as its own draft model, each with prefix caching on and with it off (six engines), over one mixed batch (20
plain prompts of repetitive text, code and prose, penalties, min_tokens, n=2, logprobs, max_tokens 1..18 with
k=5, stop strings and stop ids inside accepted runs) and a second call of 10 of its prompts (with caching on:
the same cached tokens and prefix-cache counters as speculation off; with it off: nothing cached); streamed
requests with a stop string, stop id, EOS, max_tokens or min_tokens inside an accepted run (prefix caching on)
send nothing past the stop and end as speculation off does; and a draft made of the default model's first 6
layers (k = 2, prefix caching on) on the 20 plain prompts and their second call (it accepts few drafts, so on
the CPU each of its tokens costs several target token forwards)."""

from __future__ import annotations

import pytest

from shared_engine import LLM
from shared_engine.model_loader.layer_subset import write_layer_subset
from tests.engine.spec_cases import NUMBERS, greedy, mixed_batch, prompts

K = 5
NGRAM = {"method": "ngram", "num_speculative_tokens": K, "policy": "always"}
SUFFIX = {"method": "suffix", "num_speculative_tokens": K, "policy": "always"}
# the same block count for every engine (a draft model's blocks hold its KV too), so prefix-cache hits match
COMMON = {"max_model_len": 512, "num_gpu_blocks_override": 216, "max_num_seqs": 64}
DRAFT_LAYERS = 6  # of 30: a draft that is mostly wrong, sometimes right
SPECULATIVE = ["on", "suffix", "draft"]  # ngram, suffix, self-draft: the whole mixed batch, prefix caching on
NO_CACHE = [f"{name}_no_cache" for name in SPECULATIVE]  # the same three with prefix caching off, same batch


def _draft(model, k: int = K) -> dict:
    return {"method": "draft_model", "model": str(model), "num_speculative_tokens": k, "policy": "always"}


def _run(llm: LLM, cases):
    return llm.generate([p for _, p, _ in cases], [s for _, _, s in cases], use_tqdm=False)


def _summary(output):
    return [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in output.outputs]


@pytest.fixture(scope="module")
def runs(default_model_dir, tmp_path_factory):
    cases = mixed_batch()
    layers = write_layer_subset(default_model_dir, tmp_path_factory.mktemp("draft-layers"), DRAFT_LAYERS)
    methods = {"on": NGRAM, "suffix": SUFFIX, "draft": _draft(default_model_dir)}
    engines = {"off": LLM(**COMMON)}
    for name, config in methods.items():
        engines[name] = LLM(**COMMON, speculative_config=config)
        engines[f"{name}_no_cache"] = LLM(**COMMON, enable_prefix_caching=False, speculative_config=config)
    # k = 2: each rejected draft costs a verified token, and this draft's are mostly rejected
    engines["draft_layers"] = LLM(**COMMON, speculative_config=_draft(layers, k=2))
    results = {name: _run(engines[name], cases) for name in ("off", *SPECULATIVE, *NO_CACHE)}
    results["draft_layers"] = _run(engines["draft_layers"], cases[:len(prompts())])  # the plain prompts
    again = [(f"again{i}", p, greedy()) for i, p in enumerate(prompts()[::2])]
    second = {name: _run(engines[name], again) for name in ("off", *SPECULATIVE, *NO_CACHE, "draft_layers")}
    return cases, engines, results, second


@pytest.mark.parametrize("engine", [*SPECULATIVE, *NO_CACHE, "draft_layers"])
def test_greedy_identity_mixed_batch(runs, engine):
    cases, _, results, _ = runs
    for (case, _, _), off, on in zip(cases, results["off"], results[engine]):
        assert _summary(on) == _summary(off), case


@pytest.mark.parametrize("engine", [*SPECULATIVE, *NO_CACHE])
def test_speculation_was_exercised(runs, engine):
    cases, engines, results, _ = runs
    spec = engines[engine].engine.stats.spec
    assert spec.num_accepted_tokens_total > 100 and spec.num_draft_tokens_total > spec.num_accepted_tokens_total
    by_case = {case: out for (case, _, _), out in zip(cases, results[engine])}
    # the stops fall inside NUMBERS' accepted runs: "4," is followed by " 5, 1, ..." that was drafted too
    stopped = by_case["stop_str"].outputs[0]
    assert stopped.text.endswith("3, ") and stopped.finish_reason == "stop"
    assert by_case["stop_str_kept"].outputs[0].text.endswith("4,")
    assert by_case["stop_id"].outputs[0].token_ids[-1] == 37 and by_case["stop_id"].outputs[0].stop_reason == 37
    for m in range(1, 19):
        assert len(by_case[f"max{m}"].outputs[0].token_ids) == m


@pytest.mark.parametrize("engine", [*SPECULATIVE, *NO_CACHE])
def test_logprobs_are_the_targets(runs, engine):
    cases, _, results, _ = runs
    for (case, _, params), off, on in zip(cases, results["off"], results[engine]):
        if params.logprobs is None:
            continue
        a, b = off.outputs[0], on.outputs[0]
        assert len(b.logprobs) == len(b.token_ids) == len(a.logprobs)
        for pa, pb in zip(a.logprobs, b.logprobs):
            assert pa.keys() == pb.keys(), case
            for tid in pa:
                assert pb[tid].logprob == pytest.approx(pa[tid].logprob, abs=1e-4)
                assert pb[tid].logprob != 0.0 or pa[tid].logprob == 0.0


def test_draft_model_acceptance(runs):
    """The model as its own draft accepts nearly everything on the plain prompts (its drafts are the target's
    argmax, up to fp32 differences between the decode and the k + 1-query attention paths; the mixed batch's
    penalty cases reject its unpenalised drafts more often); its first 6 layers much less, but not nothing."""
    _, engines, _, _ = runs
    spec = {name: engines[name].engine.stats.spec for name in ("draft", "draft_no_cache", "draft_layers")}
    rate = {name: s.num_accepted_tokens_total / s.num_draft_tokens_total for name, s in spec.items()}
    assert rate["draft"] >= 0.8 and rate["draft_no_cache"] >= 0.8
    assert spec["draft_layers"].num_accepted_tokens_total >= 10 and rate["draft_layers"] < 0.5


@pytest.mark.parametrize("engine", [*SPECULATIVE, "draft_layers"])
def test_second_call_hits_the_prefix_cache_the_same(runs, engine):
    _, engines, _, second = runs
    for off, on in zip(second["off"], second[engine]):
        assert _summary(on) == _summary(off)
        assert on.num_cached_tokens == off.num_cached_tokens
    assert sum(o.num_cached_tokens for o in second[engine]) > 0
    if engine == "draft_layers":  # its first call had the plain prompts only: totals differ from "off"'s
        return
    s_off, s_on = engines["off"].engine.scheduler, engines[engine].engine.scheduler
    assert (s_on.prefix_cache_queries, s_on.prefix_cache_hits) == (s_off.prefix_cache_queries, s_off.prefix_cache_hits)


@pytest.mark.parametrize("engine", NO_CACHE)
def test_without_prefix_caching_nothing_is_cached_and_the_second_call_is_the_same(runs, engine):
    """Prefix caching off: no output reports cached tokens and the scheduler counts no hits, on either call,
    where speculation off with caching hit on the second call; the second call's outputs still equal its."""
    _, engines, results, second = runs
    for off, on in zip(second["off"], second[engine]):
        assert _summary(on) == _summary(off)
    assert all(o.num_cached_tokens == 0 for o in results[engine] + second[engine])
    assert engines[engine].engine.scheduler.prefix_cache_hits == 0
    assert sum(o.num_cached_tokens for o in second["off"]) > 0


def test_generation_tokens_count_returned_tokens(runs):
    _, engines, results, second = runs
    for name in ("off", *SPECULATIVE, *NO_CACHE, "draft_layers"):
        returned = sum(len(c.token_ids) for out in results[name] + second[name] for c in out.outputs)
        assert engines[name].engine.stats.num_generation_tokens_total == returned, name
    for llm in engines.values():
        llm.engine.block_manager.check_integrity()
        assert llm.engine.block_manager.usage == 0.0


def _stream(llm: LLM, prompt_ids, params, eos=None):
    """Every RequestOutput of one streamed request, with an optional EOS id override (both engines)."""
    engine = llm.engine
    saved = engine.eos_token_ids
    if eos is not None:
        engine.eos_token_ids = frozenset({eos})
    try:
        engine.add_request("s", prompt_ids, params)
        outputs = []
        while engine.has_unfinished_requests():
            outputs += engine.step()
        return outputs
    finally:
        engine.eos_token_ids = saved


@pytest.mark.parametrize("engine", SPECULATIVE)
@pytest.mark.parametrize("kind", ["stop_str", "stop_id", "eos", "length"])
def test_stream_sends_nothing_past_the_stop(runs, kind, engine):
    _, engines, _, _ = runs
    ids = engines["off"].get_tokenizer()(NUMBERS)["input_ids"]
    params = {"stop_str": greedy(stop=["4,"]), "stop_id": greedy(stop_token_ids=[37]), "eos": greedy(),
              "length": greedy(9)}[kind]
    eos = 35 if kind == "eos" else None  # "3": EOS inside an accepted run of " 2, 3, 4, ..."
    off, on = (_stream(engines[n], ids, params, eos) for n in ("off", engine))
    final = off[-1].outputs[0]
    assert _summary(on[-1]) == _summary(off[-1])
    assert len(on) < len(off)  # fewer steps: runs of accepted tokens arrived together
    for out in on:
        c = out.outputs[0]
        assert final.token_ids[: len(c.token_ids)] == c.token_ids
        assert final.text.startswith(c.text[: c.stream_safe_len])
    if kind == "eos":
        assert final.token_ids[-1] == 35 and final.finish_reason == "stop"


@pytest.mark.parametrize("engine", ["off", *SPECULATIVE])
@pytest.mark.parametrize("ender", ["length", "eos"])
def test_a_stop_string_wins_over_a_later_end_of_the_same_step(runs, engine, ender):
    """The stop string completes at token L while max_tokens (= L) or an EOS (at a later token of the same
    accepted run) also ends the request in that step: the stop string came first, so the finish reason is
    "stop", the stop reason the string and the text cut before it (vLLM's order), with speculation and without."""
    _, engines, _, _ = runs
    ids = engines["off"].get_tokenizer()(NUMBERS)["input_ids"]
    full = _stream(engines["off"], ids, greedy(24))[-1].outputs[0].token_ids
    stopped = _stream(engines["off"], ids, greedy(24, stop=["4,"]))[-1].outputs[0]
    n = len(stopped.token_ids)
    assert stopped.stop_reason == "4," and n < len(full)
    if ender == "length":
        params, eos = greedy(n, stop=["4,"]), None
    else:  # the first token after the string that the output has not produced before
        eos = next(t for t in full[n:] if t not in full[:n])
        params = greedy(24, stop=["4,"])
    final = _stream(engines[engine], ids, params, eos)[-1].outputs[0]
    assert (final.finish_reason, final.stop_reason, final.text) == ("stop", "4,", stopped.text)
    assert final.token_ids == stopped.token_ids


@pytest.mark.parametrize("engine", SPECULATIVE)
@pytest.mark.parametrize("min_tokens", [2, 5, 9])
def test_min_tokens_holds_eos_and_stop_ids_back_inside_an_accepted_run(runs, engine, min_tokens):
    """EOS ("3", id 35) and a stop id ("4", 37) recur inside NUMBERS' accepted runs: under min_tokens they are
    masked at each position before it (not at the step's first only) and stop the request at the first position
    after it, as with speculation off."""
    _, engines, _, _ = runs
    ids = engines["off"].get_tokenizer()(NUMBERS)["input_ids"]
    cases = [(greedy(24, min_tokens=min_tokens), 35), (greedy(24, min_tokens=min_tokens, stop_token_ids=[37]), None)]
    for params, eos in cases:
        off, on = (_stream(engines[n], ids, params, eos)[-1] for n in ("off", engine))
        assert _summary(on) == _summary(off), (min_tokens, eos)
        final = off.outputs[0]
        assert final.finish_reason == "stop" and len(final.token_ids) >= min_tokens


@pytest.mark.parametrize("engine", ["off", *SPECULATIVE])
def test_a_stop_id_that_completes_the_stop_string_keeps_its_reason(runs, engine):
    """A tie: the stop id's own token is the stop string's last one. The id ended the request at that token and
    keeps the stop reason (the string only wins when it completed before the scheduler's ending token)."""
    _, engines, _, _ = runs
    tokenizer = engines["off"].get_tokenizer()
    ids = tokenizer(NUMBERS)["input_ids"]
    full = _stream(engines["off"], ids, greedy(24))[-1].outputs[0].token_ids
    j = next(j for j in range(2, len(full)) if full[j] not in full[:j])  # a token's first appearance
    string = tokenizer.decode(full[j - 1: j + 1])
    assert string.strip() and string not in tokenizer.decode(full[:j])
    final = _stream(engines[engine], ids, greedy(24, stop=[string], stop_token_ids=[full[j]]))[-1].outputs[0]
    assert (final.finish_reason, final.stop_reason) == ("stop", full[j])
    assert final.token_ids == full[: j + 1]

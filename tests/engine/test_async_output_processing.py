"""Async output processing (`enable_async_output_proc`, engine/async_output.py) against the synchronous
step: identical tokens, text, finish and stop reasons and logprobs for chunked prefill mixed with decodes,
stop strings ending requests mid-batch (with and without the stop text), EOS / stop token ids /
max_tokens, min_tokens, prompt logprobs, n=2 with a seed, an abort between steps and preemption under a
small KV pool; a request a stop string finishes never reports a later token, is never counted for it, and
frees its blocks at once. The block manager's integrity is checked after every step."""

from __future__ import annotations

import pytest

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.sampling_params import SamplingParams

MODES = ["output", "scheduling"]  # enable_async_output_proc, async_scheduling
_FLAGS = {None: {}, "output": {"enable_async_output_proc": True}, "scheduling": {"async_scheduling": True}}


@pytest.fixture(params=MODES)
def mode(request) -> str:
    return request.param


def _engine(model_dir, mode: str | None, **settings) -> LLMEngine:
    """`mode` None: the synchronous step; "output": async output processing; "scheduling": async scheduling."""
    return LLMEngine(EngineConfig.from_flat(model=str(model_dir), device="cpu", **_FLAGS[mode], **settings))


def _tiny(tiny_model_dir, mode: str | None, **settings) -> LLMEngine:
    return _engine(tiny_model_dir, mode, load_format="dummy", **settings)


def _assert_no_block_held(engine: LLMEngine) -> None:
    """Every request is done: no block table, no reference, every block free (cached prefix blocks are free
    too: evictable), with prefix caching on or off."""
    bm = engine.block_manager
    assert not bm.block_tables and not any(bm.ref_counts), "a finished or aborted request still holds blocks"
    assert bm.num_free_blocks == bm.num_blocks and bm.usage == 0.0


def _drive(engine: LLMEngine, requests: list[tuple[str, list[int], SamplingParams]],
           abort_after: dict[int, str] | None = None) -> tuple[dict, dict]:
    """Add `requests`, step until done (aborting `abort_after[k]` after step k), checking block integrity
    after every step. Returns the final output per request id and every output streamed per request id."""
    for request_id, ids, params in requests:
        engine.add_request(request_id, ids, params)
    final, streamed = {}, {}
    num_steps = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            assert output.request_id not in final, "an output after the finished one"
            streamed.setdefault(output.request_id, []).append(output)
            if output.finished:
                final[output.request_id] = output
                for c in output.outputs:  # a finished request holds no blocks
                    assert f"{c.index}_{output.request_id}" not in engine.block_manager.block_tables
                    assert output.request_id not in engine.block_manager.block_tables
        engine.block_manager.check_integrity()
        num_steps += 1
        if abort_after and num_steps in abort_after:
            engine.abort_request(abort_after[num_steps])
            engine.block_manager.check_integrity()
            assert abort_after[num_steps] not in engine.block_manager.block_tables
        assert num_steps < 500
    _assert_no_block_held(engine)
    return final, streamed


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for request_id in want:
        g, w = got[request_id], want[request_id]
        assert g.finished and w.finished
        for gc, wc in zip(g.outputs, w.outputs, strict=True):
            assert (gc.token_ids, gc.text, gc.finish_reason, gc.stop_reason) == \
                (wc.token_ids, wc.text, wc.finish_reason, wc.stop_reason), request_id
            assert (gc.logprobs is None) == (wc.logprobs is None)
            for ge, we in zip(gc.logprobs or [], wc.logprobs or [], strict=True):
                assert sorted(ge) == sorted(we)
                assert [ge[t].logprob for t in sorted(ge)] == pytest.approx([we[t].logprob for t in sorted(we)],
                                                                            abs=1e-4)
        assert (g.prompt_logprobs is None) == (w.prompt_logprobs is None)
        if w.prompt_logprobs is not None:
            assert [list(e or {}) for e in g.prompt_logprobs] == [list(e or {}) for e in w.prompt_logprobs]


def _assert_no_token_after_finish(streamed: dict, final: dict) -> None:
    """Every streamed output's tokens are a prefix of the final ones (nothing sent is taken back)."""
    for request_id, outputs in streamed.items():
        for output in outputs:
            for c, f in zip(output.outputs, final[request_id].outputs, strict=True):
                assert f.token_ids[: len(c.token_ids)] == c.token_ids


def _both(make, requests, mode: str, **kwargs) -> tuple[tuple[dict, dict], tuple[dict, dict], list[LLMEngine]]:
    engines = [make(None), make(mode)]
    off, on = (_drive(e, requests, **kwargs) for e in engines)
    return off, on, engines


# ---- token-level: the tiny dummy-weight model -------------------------------------------------------------
def test_chunked_prefill_and_decodes_staggered(tiny_model_dir, mode):
    requests = [(f"r{i}", [(7 * i + j) % 120 + 3 for j in range(5 + 9 * i)],
                 SamplingParams(temperature=0.0, max_tokens=3 + 2 * i, ignore_eos=True,
                                logprobs=2 if i % 2 else None, prompt_logprobs=1 if i == 1 else None))
                for i in range(6)]
    (off, _), (on, streamed), engines = _both(
        lambda flag: _tiny(tiny_model_dir, flag, max_num_batched_tokens=16, num_gpu_blocks_override=64), requests,
        mode)
    _assert_same(on, off)
    _assert_no_token_after_finish(streamed, on)
    assert [e.stats.num_generation_tokens_total for e in engines] == [sum(3 + 2 * i for i in range(6))] * 2
    assert engines[0].stats.num_prompt_tokens_total == engines[1].stats.num_prompt_tokens_total


def test_eos_stop_token_ids_max_tokens_and_min_tokens(tiny_model_dir, mode):
    prompt = [5, 6, 7, 8, 9]
    probe = _tiny(tiny_model_dir, None, num_gpu_blocks_override=64)
    ref, _ = _drive(probe, [("p", prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))])
    tokens = ref["p"].outputs[0].token_ids
    eos, stop_id = tokens[3], tokens[5]

    def make(flag):
        engine = _tiny(tiny_model_dir, flag, num_gpu_blocks_override=64)
        engine.eos_token_ids = frozenset({eos})  # the dummy model's 4th greedy token ends it as EOS would
        return engine

    requests = [("eos", prompt, SamplingParams(temperature=0.0, max_tokens=12)),
                ("stop_id", prompt, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                                                   stop_token_ids=[stop_id])),
                ("min", prompt, SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6)),
                ("length", prompt[:3], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))]
    (off, _), (on, streamed), _ = _both(make, requests, mode)
    _assert_same(on, off)
    _assert_no_token_after_finish(streamed, on)
    assert len(on["eos"].outputs[0].token_ids) == tokens.index(eos) + 1
    assert on["stop_id"].outputs[0].stop_reason == stop_id
    assert on["length"].outputs[0].finish_reason == "length"


def test_parallel_sampling_with_seed(tiny_model_dir, mode):
    requests = [("n2", [5, 6, 7, 8], SamplingParams(n=2, temperature=0.9, seed=11, max_tokens=7, ignore_eos=True,
                                                    logprobs=1)),
                ("g", [9, 10, 11], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))]
    (off, _), (on, _), _ = _both(lambda flag: _tiny(tiny_model_dir, flag, num_gpu_blocks_override=64), requests,
                                 mode)
    _assert_same(on, off)
    assert on["n2"].outputs[0].token_ids != on["n2"].outputs[1].token_ids


def test_abort_between_steps_frees_blocks(tiny_model_dir, mode):
    requests = [(f"r{i}", [3 + i, 4, 5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
                for i in range(3)]
    (off, off_streamed), (on, on_streamed), _ = _both(
        lambda flag: _tiny(tiny_model_dir, flag, num_gpu_blocks_override=64), requests, mode, abort_after={4: "r1"})
    assert "r1" not in off and "r1" not in on  # aborted: never finished
    assert on_streamed["r1"] and off_streamed["r1"]
    _assert_same(on, off)


def test_preemption_under_a_small_kv_pool(tiny_model_dir, mode):
    requests = [(f"r{i}", [(3 * i + j) % 100 + 3 for j in range(20)],
                 SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)) for i in range(4)]
    (off, _), (on, _), engines = _both(
        lambda flag: _tiny(tiny_model_dir, flag, num_gpu_blocks_override=9, max_model_len=64), requests, mode)
    assert all(e.scheduler.num_preemptions_total > 0 for e in engines)
    _assert_same(on, off)


# ---- stop strings: the default model and its tokenizer ----------------------------------------------------
PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Hello, my name is", "Water boils at"]


@pytest.fixture(scope="module", params=MODES)
def default_engines(default_model_dir, request):
    return [_engine(default_model_dir, flag, max_model_len=256, num_gpu_blocks_override=64,
                    max_num_batched_tokens=16) for flag in (None, request.param)]


def test_stop_strings_mid_batch(default_engines):
    off_engine, on_engine = default_engines
    tok = off_engine.tokenizer
    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    free_runs = [_drive(e, [(f"p{i}", tok.encode(p), greedy) for i, p in enumerate(PROMPTS)])[0]
                 for e in default_engines]
    _assert_same(free_runs[1], free_runs[0])
    free = {rid: out.outputs[0].text for rid, out in free_runs[0].items()}
    requests = []
    for i, p in enumerate(PROMPTS):  # each stop string is a piece of the free-running text, at a different place
        text = free[f"p{i}"]
        at = 2 + (5 * i) % max(1, len(text) - 6)
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, stop=[text[at : at + 3]],
                                include_stop_str_in_output=i == 1, logprobs=1 if i == 2 else None,
                                min_tokens=2 if i == 3 else 0)
        requests.append((f"s{i}", tok.encode(p), params))
    tokens_before = [e.stats.num_generation_tokens_total for e in default_engines]
    off, _ = _drive(off_engine, requests)
    on, streamed = _drive(on_engine, requests)
    _assert_same(on, off)
    _assert_no_token_after_finish(streamed, on)
    for i, (_, _, params) in enumerate(requests):
        c = on[f"s{i}"].outputs[0]
        assert c.finish_reason == "stop" and c.stop_reason == params.stop[0] and len(c.token_ids) < 10
        assert free[f"p{i}"].startswith(c.text)
        assert c.text.endswith(c.stop_reason) if params.include_stop_str_in_output else c.stop_reason not in c.text
    counted = [e.stats.num_generation_tokens_total - b for e, b in zip(default_engines, tokens_before)]
    assert counted[1] == counted[0] == sum(len(r.outputs[0].token_ids) for r in on.values())


def test_stop_string_request_frees_blocks_when_its_output_is_final(default_engines):
    _, engine = default_engines
    tok = engine.tokenizer
    engine.add_request("stop", tok.encode(PROMPTS[1]), SamplingParams(temperature=0.0, max_tokens=10, stop=[" 6"]))
    engine.add_request("long", tok.encode(PROMPTS[0]), SamplingParams(temperature=0.0, max_tokens=10,
                                                                      ignore_eos=True))
    finished_at = None
    reported_after = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id == "stop":
                if finished_at is not None:
                    reported_after.append(output)
                elif output.finished:
                    finished_at = engine.stats.num_steps
                    assert "stop" not in engine.block_manager.block_tables
                    assert "stop" not in engine.scheduler.requests
                    assert output.outputs[0].text == " 5,"
                    # it was already scheduled into the step in flight, whose token for it is dropped
                    in_flight = engine.async_outputs.in_flight.out.scheduled
                    request = next(s.request for s in in_flight if s.request_id == "stop")
                    num_tokens = len(output.outputs[0].token_ids)
        engine.block_manager.check_integrity()
    assert finished_at is not None and not reported_after
    assert request.num_output_tokens == num_tokens  # nothing appended after the stop

"""Async scheduling (`async_scheduling`, engine/async_output.py): step n+1 is scheduled and launched before
step n is collected, its inputs read step n's sampled ids on the device through placeholders. What only
this mode does is tested here (the outputs against the synchronous step, for every feature, are in
test_async_output_processing.py, which runs both async modes): the order of launch and collect, the
placeholders in the scheduler and the input builder, no row scheduled past a length limit, the wasted row
after an EOS, and penalties, which wait for the step in flight."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from shared_engine.config import EngineConfig
from shared_engine.core.request import Request
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.model_executor.input_builder import build_inputs
from shared_engine.sampling_params import SamplingParams


def _tiny(tiny_model_dir, async_scheduling: bool, **settings) -> LLMEngine:
    return LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), device="cpu", load_format="dummy",
                                            async_scheduling=async_scheduling, num_gpu_blocks_override=64,
                                            **settings))


def _record(engine: LLMEngine) -> list[tuple[str, int]]:
    """Wrap the runner's launch and collect; returns the log of ("launch" | "collect", step number)."""
    log: list[tuple[str, int]] = []
    runner, launch, collect = engine.runner, engine.runner.launch, engine.runner.collect

    def launch_and_log(out, previous=None):
        step = launch(out, previous)
        step.test_number = sum(kind == "launch" for kind, _ in log)
        log.append(("launch", step.test_number))
        return step

    def collect_and_log(step):
        log.append(("collect", step.test_number))
        return collect(step)

    runner.launch, runner.collect = launch_and_log, collect_and_log
    return log


def _rows_per_request(engine: LLMEngine) -> dict[str, int]:
    """Wrap the scheduler; returns the count of steps each request was scheduled into."""
    rows: dict[str, int] = {}
    schedule = engine.scheduler.schedule

    def schedule_and_count(now=None):
        out = schedule(now)
        for item in out.scheduled:
            rows[item.request_id] = rows.get(item.request_id, 0) + 1
        return out

    engine.scheduler.schedule = schedule_and_count
    return rows


def _run(engine: LLMEngine, requests) -> dict[str, list[int]]:
    for request_id, ids, params in requests:
        engine.add_request(request_id, ids, params)
    tokens = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = output.outputs[0].token_ids
        engine.block_manager.check_integrity()
    return tokens


def test_next_step_is_launched_before_the_step_in_flight_is_collected(tiny_model_dir):
    engine = _tiny(tiny_model_dir, True)
    log = _record(engine)
    engine.add_request("a", [5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    engine.step()  # launches the prefill
    engine.step()  # launches the first decode, then collects the prefill
    assert log == [("launch", 0), ("launch", 1), ("collect", 0)]
    in_flight = engine.async_outputs.in_flight.out.scheduled[0]
    # the decode's input was the prefill's sampled token, unknown when it was scheduled: a placeholder
    assert in_flight.token_ids == [-1] and in_flight.start_position == 4
    request = in_flight.request
    assert request.output_token_ids[-1] == -1 and request.output_token_ids[0] >= 0  # first token resolved
    while engine.has_unfinished_requests():
        engine.step()
    launches = [n for kind, n in log if kind == "launch"]
    collects = [n for kind, n in log if kind == "collect"]
    assert launches == collects == list(range(6))
    for n in range(1, 6):  # every step was launched before its predecessor was collected
        assert log.index(("launch", n)) < log.index(("collect", n - 1))


def test_same_tokens_and_no_row_past_a_length_limit(tiny_model_dir):
    requests = [("short", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)),
                ("long", [9, 10, 11, 12, 13], SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)),
                ("model_len", [3] * 20, SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))]
    sync, overlap = _tiny(tiny_model_dir, False, max_model_len=24), _tiny(tiny_model_dir, True, max_model_len=24)
    sync_rows, overlap_rows = _rows_per_request(sync), _rows_per_request(overlap)
    want, got = _run(sync, requests), _run(overlap, requests)
    assert got == want
    assert len(got["model_len"]) == 4  # max_model_len 24 - 20 prompt tokens
    # one prefill row and one decode row per token after the first: nothing scheduled after the last token
    assert overlap_rows == sync_rows == {"short": 3, "long": 9, "model_len": 4}
    assert overlap.stats.num_generation_tokens_total == sync.stats.num_generation_tokens_total == 16


def test_eos_wastes_one_row_and_drops_its_token(tiny_model_dir):
    prompt = [5, 6, 7, 8, 9]
    probe = _run(_tiny(tiny_model_dir, False), [("p", prompt, SamplingParams(temperature=0.0, max_tokens=12,
                                                                               ignore_eos=True))])["p"]
    eos = probe[3]
    engines = [_tiny(tiny_model_dir, flag) for flag in (False, True)]
    rows = []
    for engine in engines:
        engine.eos_token_ids = frozenset({eos})
        rows.append(_rows_per_request(engine))
    outputs = [_run(e, [("eos", prompt, SamplingParams(temperature=0.0, max_tokens=12))]) for e in engines]
    assert outputs[0] == outputs[1] == {"eos": probe[: probe.index(eos) + 1]}
    # scheduled once more than the synchronous step: its EOS was not known when the next step was scheduled
    assert rows[1]["eos"] == rows[0]["eos"] + 1
    assert engines[1].stats.num_generation_tokens_total == engines[0].stats.num_generation_tokens_total
    for engine in engines:  # nothing held after the EOS, also the wasted row's block (prefix caching is on)
        bm = engine.block_manager
        assert engine.config.cache.enable_prefix_caching
        assert not bm.block_tables and not any(bm.ref_counts) and bm.num_free_blocks == bm.num_blocks


def test_penalties_wait_for_the_step_in_flight(tiny_model_dir):
    requests = [("plain", [5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)),
                ("penalised", [5, 6, 7, 9], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True,
                                                           repetition_penalty=1.5, frequency_penalty=0.5,
                                                           presence_penalty=0.3))]
    want = _run(_tiny(tiny_model_dir, False), requests)
    engine = _tiny(tiny_model_dir, True)
    log = _record(engine)
    assert _run(engine, requests) == want
    # with a penalised request decoding, step n is collected before step n+1 is launched
    for n in range(1, 8):
        assert log.index(("collect", n - 1)) < log.index(("launch", n))


def test_prefix_hits_with_requests_arriving_mid_run(tiny_model_dir):
    shared = [(3 * j) % 100 + 3 for j in range(40)]
    first = [("a", shared + [7], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))]
    later = [(f"b{i}", shared + [8 + i], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
             for i in range(3)]
    results = []
    for flag in (False, True):
        engine = _tiny(tiny_model_dir, flag)
        tokens = _run(engine, first)
        tokens |= _run(engine, later)
        results.append((tokens, engine.scheduler.prefix_cache_hits))
    assert results[1] == results[0]
    assert results[1][1] >= 3 * 32  # the later requests read the shared prompt's two full blocks... each


def _item(request_id: str, token_ids: list[int], start: int, table: list[int]) -> ScheduledRequest:
    request = Request(request_id, [1] * max(start, 1), SamplingParams(max_tokens=4), max_tokens=4)
    return ScheduledRequest(request, token_ids, start, table, True)


def test_input_builder_fills_placeholders_from_the_previous_step():
    out = SchedulerOutput([_item("a", [-2], 5, [0]), _item("b", [11], 3, [1]), _item("c", [-1], 7, [2]),
                           _item("d", [4, 5, 6], 0, [3])], num_batched_tokens=6)
    inputs = build_inputs(out, 16, torch.device("cpu"))
    assert inputs.input_ids.tolist() == [0, 11, 0, 4, 5, 6]  # placeholders never reach the embedding as < 0
    where, rows = inputs.placeholders
    assert where.tolist() == [0, 2] and rows.tolist() == [1, 0]
    with pytest.raises(RuntimeError, match="not in flight"):
        inputs.patch_placeholders(None)
    inputs.patch_placeholders(torch.tensor([70, 71, 72]))  # the previous step's sampled ids, by sampled row
    assert inputs.input_ids.tolist() == [71, 11, 70, 4, 5, 6]
    plain = build_inputs(SchedulerOutput([_item("b", [11], 3, [1])], num_batched_tokens=1), 16,
                         torch.device("cpu"))
    assert plain.placeholders is None
    assert np.array_equal(plain.input_ids.numpy(), [11])


def test_resolve_without_a_placeholder_is_an_error(tiny_model_dir):
    engine = _tiny(tiny_model_dir, False)
    engine.add_request("a", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
    out = engine.scheduler.schedule(0.0)
    with pytest.raises(RuntimeError, match="no placeholder"):
        engine.scheduler.resolve(out, {"a": [9]}, 0.0)  # apply_launched(out) never ran
    engine.scheduler.apply_launched(out, 0.0)
    assert out.scheduled[0].request.output_token_ids == [-1]
    assert [r.request_id for r in engine.scheduler.resolve(out, {"a": [9]}, 0.0)] == ["a"]
    assert out.scheduled[0].request.output_token_ids == [9]


def test_on_by_default_for_cuda_only(tiny_model_dir):
    def resolved(**settings):
        return EngineConfig.from_flat(**settings).with_resolved_defaults().scheduler.async_scheduling

    assert resolved(device="cuda") is True and resolved(device="cpu") is False
    assert resolved(device="cuda", async_scheduling=False) is False
    assert resolved(device="cpu", async_scheduling=True) is True
    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), device="cpu", load_format="dummy"))
    assert engine.config.scheduler.async_scheduling is False and engine.async_outputs is None


@pytest.mark.parametrize("flag", ["enable_async_output_proc", "async_scheduling"])
def test_a_deleted_engine_is_freed_without_the_garbage_collector(tiny_model_dir, flag):
    """No reference cycle through the stepper: on CUDA a second engine in the same process found no memory for
    its KV cache while the first one's model and cache waited for the garbage collector (H200, 4b1f168)."""
    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), device="cpu", load_format="dummy",
                                              num_gpu_blocks_override=64, **{flag: True}))
    assert _run(engine, [("a", [5, 6, 7], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))])
    gc.collect()
    gc.disable()
    try:
        engine_ref, runner_ref = weakref.ref(engine), weakref.ref(engine.runner)
        del engine
        assert engine_ref() is None and runner_ref() is None
    finally:
        gc.enable()


def test_no_preemption_for_blocks_a_finishing_request_returns(tiny_model_dir):
    """A pool of 3 blocks: B's last token is in flight when A's decode needs a second block. B's blocks return
    when that step is resolved, so A waits a step instead of being preempted (review finding on 7d544a4)."""
    requests = [("B", [5] * 30, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)),
                ("A", [7] * 14, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))]
    results = []
    for flag in (False, True):
        engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), device="cpu", load_format="dummy",
                                                  async_scheduling=flag, num_gpu_blocks_override=3,
                                                  max_model_len=48))
        results.append((_run(engine, requests), engine.scheduler.num_preemptions_total))
    assert results[1] == results[0]
    assert results[1][1] == 0

"""Partial-prefill caps (`--max-num-partial-prefills`, `--max-long-partial-prefills`,
`--long-prefill-token-threshold`): a short turn's time to first token, counted in scheduler steps, stays
bounded while long cold prefills run; and the settings' validation and flag names."""

from __future__ import annotations

import argparse

import pytest

from shared_engine.config import EngineConfig, SchedulerConfig
from shared_engine.core.block_manager import BlockManager
from shared_engine.core.request import Request
from shared_engine.core.scheduler import Scheduler
from shared_engine.entrypoints.openai.cli_args import add_serve_arguments, build_configs
from shared_engine.sampling_params import SamplingParams

CAPS = dict(max_num_partial_prefills=2, max_long_partial_prefills=1, long_prefill_token_threshold=256)


def make(rid: str, prompt_len: int, max_tokens: int = 4) -> Request:
    prompt = [(hash(rid) + i) % 1000 + 3 for i in range(prompt_len)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens)


def run(config: SchedulerConfig, arrivals: dict[int, list[Request]], steps: int = 200) -> dict[str, int]:
    """Step the scheduler (no model: every sampled token is 7); returns each request's first-token step."""
    sched = Scheduler(config, BlockManager(1200, 16), max_model_len=8192)
    first: dict[str, int] = {}
    for step in range(steps):
        for request in arrivals.get(step, []):
            sched.add_request(request)
        out = sched.schedule(now=float(step))
        assert out.num_batched_tokens <= config.token_budget
        if config.max_num_partial_prefills is not None:
            mid = [r for r in sched.running if r.num_remaining_tokens > 1]
            assert len(mid) <= config.max_num_partial_prefills
            assert sum(r.num_remaining_tokens > config.long_prefill_token_threshold for r in mid) <= (
                config.max_long_partial_prefills or len(mid))
        for item in out.scheduled:
            if item.needs_sample:
                first.setdefault(item.request_id, step)
        sched.update_from_output(out, {s.request_id: [7] for s in out.scheduled if s.needs_sample}, float(step))
        sched.block_manager.check_integrity()
        if not sched.has_unfinished_requests() and step > max(arrivals):
            break
    return first


def workload() -> dict[int, list[Request]]:
    # two cold 6,000-token prompts, then a short turn every 3 steps while they prefill
    return {0: [make("long0", 6000)], 1: [make("long1", 6000)],
            **{2 + 3 * i: [make(f"short{i}", 100)] for i in range(8)}}


def test_caps_bound_a_short_turns_ttft_in_steps():
    config = SchedulerConfig(max_num_batched_tokens=512, **CAPS)
    first = run(config, workload())
    shorts = {i: first[f"short{i}"] - (2 + 3 * i) for i in range(8)}
    # each short turn samples in the step it arrives, or the next when both partial-prefill slots are taken
    # (the step where long0's last chunk runs and long1 starts)
    assert max(shorts.values()) <= 1 and sum(shorts.values()) <= 1, shorts
    # the long prefills still progress: 256 tokens a step, one after the other (one long slot)
    assert first["long0"] == -(-6000 // 256) - 1
    assert first["long1"] > first["long0"]
    assert set(first) == {"long0", "long1", *(f"short{i}" for i in range(8))}


def test_without_caps_a_short_turn_waits_for_the_long_prefills():
    """The reference: the same trace without caps (the test above would fail without them)."""
    first = run(SchedulerConfig(max_num_batched_tokens=512), workload())
    assert first["short0"] - 2 >= 10  # behind long0's and long1's 512-token chunks


def test_max_num_partial_prefills_alone():
    config = SchedulerConfig(max_num_batched_tokens=512, max_num_partial_prefills=1)
    first = run(config, {0: [make("a", 1000)], 1: [make("b", 100)]})
    assert first["a"] == 1 and first["b"] == 2  # b starts only after a's prefill ends


@pytest.mark.parametrize("settings, message", [
    (dict(max_num_partial_prefills=0), "max_num_partial_prefills must be >= 1"),
    (dict(max_num_partial_prefills=2, max_long_partial_prefills=3, long_prefill_token_threshold=8),
     "max_long_partial_prefills must be >= 1 and <= 2"),
    (dict(max_long_partial_prefills=1), "max_long_partial_prefills needs long_prefill_token_threshold"),
    (dict(long_prefill_token_threshold=-1), "long_prefill_token_threshold must be >= 0"),
    (dict(long_prefill_token_threshold=64, enable_chunked_prefill=False), "need enable_chunked_prefill"),
])
def test_validation_names_field_and_range(settings, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**settings)


def test_cli_yaml_and_python_share_the_names(tmp_path):
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text("max-long-partial-prefills: 1\nlong_prefill_token_threshold: 2048\n")
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    engine, _ = build_configs(parser.parse_args(["--config", str(yaml_file), "--max-num-partial-prefills", "4"]))
    assert engine.scheduler == EngineConfig.from_flat(**CAPS | dict(
        max_num_partial_prefills=4, long_prefill_token_threshold=2048)).scheduler

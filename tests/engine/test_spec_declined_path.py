"""A step the auto policy declines takes exactly the path of speculation unconfigured (issue 17): with
async scheduling, the same launch / collect order (no step resolved early to propose), the same scheduled
rows and the same tokens, through a run whose batch shrinks (at c518670 the policy resolved the step in
flight early every 16th step and whenever the batch shrank, even where it then drafted nothing)."""

from __future__ import annotations

from shared_engine.config import EngineConfig
from shared_engine.core.request import Request
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.sampling_params import SamplingParams
from tests.engine.test_async_scheduling import _record


def _engine(tiny_model_dir, spec: dict | None) -> LLMEngine:
    return LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), device="cpu", load_format="dummy",
                                            async_scheduling=True, num_gpu_blocks_override=64,
                                            speculative_config=spec))


def _decline_everywhere(policy) -> None:
    """A fitted step model where a speculative step costs a second more than a plain one, and a decision
    (at the prior's rate) that drafted nothing."""
    for tokens, spec in ((1, False), (4, True), (8, False), (32, False), (12, True)) * 4:
        policy.observe_step(tokens, spec, 0.005 + 1e-4 * tokens + 1.0 * spec)
    reqs = [Request(f"p{i}", [1], SamplingParams(max_tokens=8), max_tokens=8) for i in range(4)]
    assert policy.num_drafts(reqs, 4) == [0] * 4


def _run(engine: LLMEngine) -> tuple[list, list, dict]:
    log = _record(engine)
    rows = []
    schedule = engine.scheduler.schedule

    def schedule_and_log(now=None):
        out = schedule(now)
        rows.append([(i.request_id, i.start_position, len(i.token_ids), i.num_draft_tokens, i.needs_sample)
                     for i in out.scheduled])
        return out

    engine.scheduler.schedule = schedule_and_log
    # repetitive prompts, so the n-gram proposer would have drafts; lengths differ, so the batch shrinks
    for n, max_tokens in enumerate((6, 20, 40)):
        engine.add_request(f"r{n}", [5, 6, 7, 8] * 6, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                    ignore_eos=True))
    tokens = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                tokens[output.request_id] = list(output.outputs[0].token_ids)
    return log, rows, tokens


def test_declined_steps_take_the_unconfigured_path(tiny_model_dir):
    plain = _run(_engine(tiny_model_dir, None))
    engine = _engine(tiny_model_dir, {"method": "ngram", "num_speculative_tokens": 3, "policy": "auto"})
    _decline_everywhere(engine.spec.policy)
    declined = _run(engine)
    assert engine.stats.spec.num_drafts_total == 0
    log, rows, tokens = declined
    assert len(plain[0]) > 2 * 40  # every step of the 40-token request, launched and collected
    assert log == plain[0]  # launch n+1 before collect n on every step: none resolved early
    assert rows == plain[1]
    assert tokens == plain[2]

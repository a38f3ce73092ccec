"""Speculation at the end of the context (handed.md K10, "drafts proposed past max_model_len"): requests whose
prompts end 1 to 9 positions before max_model_len, with max_tokens unset (up to the context limit) or set to
exactly the room left, decoded with k = 5 n-gram, suffix and self-draft-model speculation (and n-gram with async
scheduling): each stops at max_model_len exactly, finish_reason "length", with the token ids, text and logprobs
of speculation off; no forward of the target or the draft model ever runs a position at or past max_model_len
(on the CPU the rotary table has max_model_len rows, so one would also crash); the scheduler verified drafts up
to the last position, so the boundary was exercised; every block is back at the end."""

from __future__ import annotations

import pytest

from shared_engine import LLM, SamplingParams
from tests.engine.spec_cases import NUMBERS

K = 5
MAX_MODEL_LEN = 64
ROOM = range(1, 10)  # positions left after the prompt
COMMON = {"max_model_len": MAX_MODEL_LEN, "num_gpu_blocks_override": 128, "max_num_seqs": 32}
ENGINES = ["ngram", "suffix", "draft", "ngram_async"]


def _spec(method: str, model=None) -> dict:
    config = {"method": method, "num_speculative_tokens": K, "policy": "always"}
    return config if model is None else {**config, "model": str(model)}


class _Positions:
    """Wraps a model's forward: the largest position any of its forwards ran."""

    def __init__(self, model) -> None:
        self.largest = -1
        forward = model.forward

        def recording(input_ids, positions, *args, **kwargs):
            self.largest = max(self.largest, int(positions.max()))
            return forward(input_ids, positions, *args, **kwargs)

        model.forward = recording


class _Scheduled:
    """Wraps the scheduler's `schedule`: the end position of every scheduled item, and of those with drafts."""

    def __init__(self, scheduler) -> None:
        self.ends: list[int] = []
        self.draft_ends: list[int] = []
        schedule = scheduler.schedule

        def recording(*args, **kwargs):
            out = schedule(*args, **kwargs)
            for item in out.scheduled:
                end = item.start_position + len(item.token_ids)
                self.ends.append(end)
                if item.num_draft_tokens:
                    self.draft_ends.append(end)
            return out

        scheduler.schedule = recording


def _prompts(llm: LLM) -> list[list[int]]:
    ids = llm.get_tokenizer()(NUMBERS * 6)["input_ids"]
    assert len(ids) > MAX_MODEL_LEN
    return [ids[:MAX_MODEL_LEN - room] for room in ROOM]


def _params(explicit: bool) -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, logprobs=1, max_tokens=room if explicit else None) for room in ROOM]


@pytest.fixture(scope="module")
def runs(default_model_dir):
    engines = {"off": LLM(**COMMON), "ngram": LLM(**COMMON, speculative_config=_spec("ngram")),
               "suffix": LLM(**COMMON, speculative_config=_spec("suffix")),
               "draft": LLM(**COMMON, speculative_config=_spec("draft_model", default_model_dir)),
               "ngram_async": LLM(**COMMON, async_scheduling=True, speculative_config=_spec("ngram"))}
    positions = {name: [_Positions(llm.engine.runner.model)] for name, llm in engines.items()}
    positions["draft"].append(_Positions(engines["draft"].engine.spec.proposer.draft.model))
    scheduled = {name: _Scheduled(llm.engine.scheduler) for name, llm in engines.items()}
    prompts = _prompts(engines["off"])
    results = {}
    for name, llm in engines.items():
        for explicit in (False, True):
            results[name, explicit] = llm.generate([{"prompt_token_ids": p} for p in prompts], _params(explicit),
                                                   use_tqdm=False)
    return engines, positions, scheduled, prompts, results


@pytest.mark.parametrize("explicit", [False, True], ids=["max_tokens_unset", "max_tokens_the_room_left"])
@pytest.mark.parametrize("engine", ENGINES)
def test_stops_at_max_model_len_like_speculation_off(runs, engine, explicit):
    _, _, _, prompts, results = runs
    for prompt, room, off, on in zip(prompts, ROOM, results["off", explicit], results[engine, explicit]):
        a, b = off.outputs[0], on.outputs[0]
        assert len(prompt) + len(b.token_ids) == MAX_MODEL_LEN, room
        assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, "length"), room
        assert len(b.logprobs) == len(b.token_ids)
        for pa, pb in zip(a.logprobs, b.logprobs):
            assert pa.keys() == pb.keys()
            for tid in pa:
                assert pb[tid].logprob == pytest.approx(pa[tid].logprob, abs=1e-4)


@pytest.mark.parametrize("engine", ["off", *ENGINES])
def test_no_forward_runs_a_position_past_the_context(runs, engine):
    engines, positions, scheduled, _, _ = runs
    for recorder in positions[engine]:
        # the longest requests' last positions (a sampled last token is not run; a last draft is), never past them
        assert MAX_MODEL_LEN - 2 <= recorder.largest <= MAX_MODEL_LEN - 1
    assert max(scheduled[engine].ends) <= MAX_MODEL_LEN
    engines[engine].engine.block_manager.check_integrity()
    assert engines[engine].engine.block_manager.usage == 0.0


@pytest.mark.parametrize("engine", ENGINES)
def test_drafts_were_verified_up_to_the_last_position(runs, engine):
    engines, _, scheduled, _, _ = runs
    assert MAX_MODEL_LEN in scheduled[engine].draft_ends  # a step whose drafts filled the context to its end
    spec = engines[engine].engine.stats.spec
    assert spec.num_accepted_tokens_total > 50

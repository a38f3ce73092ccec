"""The `draft_model` KV mirror while speculation is off (spec_decode/draft_model_runner.py): steps of plain
decodes are not mirrored (the draft costs nothing), their blocks are marked stale, and the draft recomputes a
request's positions from its first stale block before its next proposal, also where a prefix-cache hit brings
in blocks computed while speculation was off. The default model as its own draft: every draft is accepted
exactly when its KV is right, so acceptance shows stale KV at once; greedy outputs equal speculation off."""

from __future__ import annotations

from shared_engine import LLM, SamplingParams
from tests.engine.spec_cases import PROSE, REPETITIVE

K = 4


class _WindowPolicy:
    """k drafts for every request except during the `off` calls of `num_drafts` (0-based), where none."""

    def __init__(self, off) -> None:
        self.off, self.calls = off, 0

    def max_drafts(self, num_running: int) -> int:
        return K

    def num_drafts(self, requests: list, num_running: int) -> list[int]:
        self.calls += 1
        return [0 if self.calls - 1 in self.off else K] * len(requests)

    def observe_step(self, num_tokens: int, speculative: bool, seconds: float,
                     num_draft_tokens: int | None = None, num_drafting: int = 0) -> None:
        pass


def _ids(outs) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in outs]


def _run(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return _ids(llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False))


def test_mirror_skipped_while_off_and_caught_up(default_model_dir):
    llm = LLM(max_model_len=512, kv_cache_memory=64 * 2**20, max_num_batched_tokens=32, speculative_config={
        "method": "draft_model", "model": str(default_model_dir), "num_speculative_tokens": K, "policy": "always"})
    engine, spec = llm.engine, llm.engine.spec
    draft = engine.runner.draft_runner
    sizes = []  # tokens of every draft forward: none beyond the token budget (the memory profile's size)
    forward = draft._forward
    draft._forward = lambda inputs: (sizes.append(inputs.input_ids.shape[0]), forward(inputs))[1]
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in (REPETITIVE[1], PROSE[0], PROSE[3])]
    # references with speculation (and the mirror) off; then nothing of theirs stays in the prefix cache
    engine.spec, engine.runner.draft_runner = None, None
    expected = _run(llm, prompts, 40)
    turn2 = prompts[1] + expected[1][:33]  # a second turn: its prompt holds the first turn's output
    expected2 = _run(llm, [turn2], 16)
    engine.block_manager.reset_prefix_cache()
    engine.spec, engine.runner.draft_runner = spec, draft

    stats = engine.stats.spec
    spec.policy = _WindowPolicy(off=range(2, 9))  # off for seven steps after two speculative ones
    assert _run(llm, prompts, 40) == expected
    assert draft.num_skipped_steps >= 5 and draft.num_caught_up_tokens >= 3 * 5
    assert stats.num_accepted_tokens_total >= 0.9 * stats.num_draft_tokens_total  # no stale draft KV read

    # speculation off for a whole first turn: its output blocks enter the prefix cache unmirrored; the second
    # turn hits them and its first proposal recomputes them
    spec.policy = _WindowPolicy(off=range(10**6))
    engine.block_manager.reset_prefix_cache()  # else the first turn hits the run above's (mirrored) blocks
    skipped = draft.num_skipped_steps
    assert _run(llm, [prompts[1]], 34) == [expected[1][:34]]
    assert draft.num_skipped_steps > skipped + 25 and draft.stale_blocks
    spec.policy = _WindowPolicy(off=())
    caught, hits = draft.num_caught_up_tokens, engine.stats.prefix_cache_hits_total
    drafted, accepted = stats.num_draft_tokens_total, stats.num_accepted_tokens_total
    assert _run(llm, [turn2], 16) == expected2
    assert engine.stats.prefix_cache_hits_total - hits >= 32  # tokens
    assert draft.num_caught_up_tokens - caught >= 16  # the hit blocks from the first stale one on
    assert stats.num_accepted_tokens_total - accepted >= 0.9 * (stats.num_draft_tokens_total - drafted)
    assert max(sizes) <= 32


def test_speculative_steps_run_no_mirror_forward(default_model_dir):
    """A speculative step's verified positions get their draft KV in the next proposal's first draft step: the
    draft runs forwards only for prompt chunks (the mirror) and k per proposal, never one per verify step;
    every draft still reads the right KV (the model as its own draft accepts nearly everything) and greedy
    outputs equal speculation off, also when a second call hits the prefix cache."""
    llm = LLM(max_model_len=512, kv_cache_memory=64 * 2**20, max_num_batched_tokens=64, speculative_config={
        "method": "draft_model", "model": str(default_model_dir), "num_speculative_tokens": K, "policy": "always"})
    engine, spec = llm.engine, llm.engine.spec
    draft = engine.runner.draft_runner
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in (REPETITIVE[0], PROSE[1], PROSE[2])]
    engine.spec, engine.runner.draft_runner = None, None
    expected = _run(llm, prompts, 30)
    engine.block_manager.reset_prefix_cache()
    engine.spec, engine.runner.draft_runner = spec, draft

    forwards, prefill_steps, spec_steps = [], [0], [0]
    forward, on_step = draft._forward, spec.on_step
    draft._forward = lambda inputs: (forwards.append(inputs.input_ids.shape[0]), forward(inputs))[1]

    def count(out, seconds):
        prefill = any(item.num_new_tokens > 1 and not item.num_draft_tokens for item in out.scheduled)
        prefill_steps[0] += prefill
        spec_steps[0] += out.has_drafts and not prefill  # decodes only (a prompt chunk's step is mirrored)
        on_step(out, seconds)

    spec.on_step = count
    stats = engine.stats.spec
    for batch in (prompts, prompts[:1], prompts):  # the last call hits the first's prompt blocks
        assert _run(llm, batch, 30) == [expected[prompts.index(p)] for p in batch]
    assert engine.stats.prefix_cache_hits_total > 0
    assert spec_steps[0] >= 10 and draft.num_deferred_steps == spec_steps[0]
    assert draft.num_mirror_forwards == prefill_steps[0]  # prompt chunks only
    assert draft.num_caught_up_tokens == 0 and draft.num_owed_tokens >= 2 * spec_steps[0]
    assert len(forwards) == draft.num_mirror_forwards + draft.num_proposal_steps
    assert draft.num_proposal_steps <= K * stats.num_drafts_total  # k forwards per proposal at most
    assert stats.num_accepted_tokens_total >= 0.9 * stats.num_draft_tokens_total


class _StepWindowPolicy(_WindowPolicy):
    """k drafts except while the engine's observed step count is in `off`; then `max_drafts` is 0 too, so async
    scheduling overlaps those steps (the next is launched before the one in flight is resolved)."""

    def __init__(self, off) -> None:
        super().__init__(off)
        self.steps = 0

    def max_drafts(self, num_running: int) -> int:
        return 0 if self.steps in self.off else K

    def num_drafts(self, requests: list, num_running: int) -> list[int]:
        return [self.max_drafts(len(requests))] * len(requests)

    def observe_step(self, num_tokens: int, speculative: bool, seconds: float,
                     num_draft_tokens: int | None = None, num_drafting: int = 0) -> None:
        self.steps += 1


def test_async_scheduling_owed_rows_and_speculation_off_windows(default_model_dir):
    """Async scheduling: speculative steps are resolved before the next proposal (whose step 0 takes their
    owed rows), while steps with speculation off overlap and leave stale blocks that the next proposal catches
    up; greedy outputs equal speculation off and drafts keep reading the right KV."""
    llm = LLM(max_model_len=512, kv_cache_memory=64 * 2**20, max_num_batched_tokens=32, async_scheduling=True,
              speculative_config={"method": "draft_model", "model": str(default_model_dir),
                                  "num_speculative_tokens": K, "policy": "always"})
    engine, spec = llm.engine, llm.engine.spec
    draft = engine.runner.draft_runner
    tok = llm.get_tokenizer()
    prompts = [tok.encode(p) for p in (REPETITIVE[2], PROSE[0])]
    engine.spec, engine.runner.draft_runner = None, None
    expected = _run(llm, prompts, 64)
    engine.block_manager.reset_prefix_cache()
    engine.spec, engine.runner.draft_runner = spec, draft
    spec.policy = _StepWindowPolicy(off=set(range(3, 9)) | set(range(12, 14)))
    stats = engine.stats.spec
    assert _run(llm, prompts, 64) == expected
    assert draft.num_deferred_steps >= 5 and draft.num_skipped_steps >= 3 and draft.num_caught_up_tokens > 0
    assert draft.num_owed_tokens > 0
    assert stats.num_accepted_tokens_total >= 0.9 * stats.num_draft_tokens_total

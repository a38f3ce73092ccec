"""The `draft_model` method's memory: a KV block is priced at the target's plus the draft's bytes, the draft's
scratch blocks come off the free bytes, and the draft (weights loaded) is in place when the memory profile
runs, so its weights and its own profiling pass count in the peak (the CUDA side:
test_spec_decode_cuda.py::test_memory_profile_counts_the_draft_model). Default model as its own draft, CPU."""

from __future__ import annotations

from shared_engine import LLM
from shared_engine.model_executor.model_runner import ModelRunner

MiB = 2**20


def _llm(default_model_dir, **kwargs) -> LLM:
    return LLM(max_model_len=256, max_num_seqs=4, **kwargs, speculative_config={
        "method": "draft_model", "model": str(default_model_dir), "num_speculative_tokens": 3})


def test_a_block_holds_both_caches(default_model_dir):
    llm = _llm(default_model_dir, kv_cache_memory=48 * MiB)
    runner = llm.engine.runner
    draft = runner.draft_runner
    num_blocks = llm.engine.block_manager.num_blocks
    assert num_blocks == 48 * MiB // (runner.kv_bytes_per_block + draft.kv_bytes_per_block)
    assert draft.kv_bytes_per_block == runner.kv_bytes_per_block  # the model itself: same shapes
    assert draft.num_scratch_blocks == 4 * 1  # max_num_seqs x ceil(k / block_size)
    assert all(t.shape[1] == num_blocks + draft.num_scratch_blocks for t in draft.runner.kv_caches)


def test_free_bytes_pay_for_scratch_and_the_profile_sees_the_draft(default_model_dir, monkeypatch):
    seen = []

    def free_kv_bytes(self):  # what CUDA's profile would report, and whether the draft was loaded by then
        seen.append(self.draft_runner is not None)
        return 40 * MiB

    monkeypatch.setattr(ModelRunner, "free_kv_bytes", free_kv_bytes)
    llm = _llm(default_model_dir)
    runner = llm.engine.runner
    draft = runner.draft_runner
    assert seen == [True]
    assert llm.engine.block_manager.num_blocks == (40 * MiB - draft.scratch_bytes) // (
        runner.kv_bytes_per_block + draft.kv_bytes_per_block)

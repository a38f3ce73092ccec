"""The draft model's multi-step proposal (spec_decode/fused_proposal.py), run eagerly on the CPU: the device-side
advance of positions, context lengths and KV slots between draft steps, and whole proposals through
`DraftModelRunner.propose`'s fused branch, which must draft exactly the tokens of the step-by-step path (the
default model as its own draft: nearly everything accepted, outputs equal to speculation off). The CUDA graphs
themselves are replayed in tests/engine/test_spec_decode_cuda.py."""

from __future__ import annotations

import torch

from shared_engine import LLM, SamplingParams
from shared_engine.model_executor.attention.metadata import AttentionMetadata
from shared_engine.model_executor.cuda_graph_runner import CudaGraphRunner
from shared_engine.spec_decode import fused_proposal
from shared_engine.spec_decode.fused_proposal import FusedProposal, advance, fill, run_steps
from tests.engine.spec_cases import PROSE, REPETITIVE

K, BS, MAX_LEN = 4, 16, 512


def _buffers(sizes=(1, 2, 4, 8)) -> CudaGraphRunner:
    """A graph runner's static buffers on the CPU (its layout only, nothing captured)."""
    g = CudaGraphRunner.__new__(CudaGraphRunner)
    g._layout(list(sizes), [], [], 0, -(-MAX_LEN // BS), MAX_LEN, torch.device("cpu"))
    return g


def test_advance_moves_real_rows_across_block_boundaries_and_leaves_padding():
    g = _buffers()
    tables = torch.tensor([[7, 3, 9, 0], [5, 2, 0, 0], [11, 0, 0, 0]], dtype=torch.int32)
    positions = torch.tensor([14, 17, 3])
    meta = AttentionMetadata(slot_mapping=torch.tensor([7 * BS + 14, 2 * BS + 1, 11 * BS + 3]), block_tables=tables,
                             context_lens=positions.to(torch.int32) + 1,
                             cu_seqlens_q=torch.arange(4, dtype=torch.int32),
                             num_decodes=3, max_context_len=18, max_query_len=1, context_lens_list=[15, 18, 4],
                             query_lens_list=[1, 1, 1])
    g.positions[3] = 99  # a stale padding row: fill resets it
    fill(g, 4, torch.tensor([10, 20, 30]), positions, meta)
    valid = g.slot_mapping[:4] >= 0
    assert valid.tolist() == [True, True, True, False]
    pos, ctx = positions.tolist(), [15, 18, 4]
    for step in range(1, 4):
        tokens = torch.tensor([step, 2 * step, 3 * step, 4 * step])
        advance(g, 4, tokens, valid, BS)
        pos = [p + 1 for p in pos]
        ctx = [c + 1 for c in ctx]
        expect = [int(tables[r, p // BS]) * BS + p % BS for r, p in enumerate(pos)]
        assert g.input_ids[:4].tolist() == tokens.tolist()
        assert g.positions[:4].tolist() == [*pos, 0]
        assert g.context_lens[:4].tolist() == [*ctx, 1]
        assert g.slot_mapping[:4].tolist() == [*expect, -1]
    assert g.slot_mapping[0] == 3 * BS + 1  # row 0 went from block 7 (position 14) into block 3 (position 17)


class EagerFused(FusedProposal):
    """`FusedProposal` without CUDA graphs: `run` fills the buffers and runs `run_steps` eagerly, with each step's
    host-side context lengths for the torch backend (the Triton one reads only the device tensors)."""

    def __init__(self, draft) -> None:
        self.draft = draft
        self.graphs_runner = _buffers()
        self.block_size = BS
        self.sizes = [1, 2, 4, 8]
        self.graphs = {(rows, steps): None for rows in self.sizes for steps in range(2, K + 1)}
        self.calls: list[tuple[int, int, int]] = []  # (requests, rows, steps)

    def run(self, key, input_ids, positions, meta):
        rows, steps = key
        g, n = self.graphs_runner, input_ids.shape[0]
        fill(g, rows, input_ids, positions, meta)
        self.calls.append((n, rows, steps))

        def meta_for_step(j: int) -> AttentionMetadata:
            return AttentionMetadata(
                slot_mapping=g.slot_mapping[:rows], block_tables=g.block_tables[:rows],
                context_lens=g.context_lens[:rows], cu_seqlens_q=g.cu_seqlens_q[:rows + 1], num_decodes=rows,
                max_context_len=MAX_LEN, max_query_len=1,
                context_lens_list=[c + j for c in meta.context_lens_list] + [1] * (rows - n),
                query_lens_list=[1] * rows)

        draft = self.draft
        return run_steps(draft.model, g, draft.runner.kv_caches, draft.backend, rows, steps, BS, meta_for_step)[:, :n]


def _engine(default_model_dir) -> LLM:
    return LLM(max_model_len=MAX_LEN, kv_cache_memory=64 * 2**20, max_num_seqs=8, speculative_config={
        "method": "draft_model", "model": str(default_model_dir), "num_speculative_tokens": K, "policy": "always"})


def _logged_run(llm: LLM, prompts, params) -> tuple[list[list[int]], list]:
    """Outputs, and every proposal's drafts (per request, in the proposal's order)."""
    proposer = llm.engine.spec.proposer
    log, original = [], proposer.propose

    def propose(requests, caps):
        drafts = original(requests, caps)
        log.append([list(d) for d in drafts])
        return drafts

    proposer.propose = propose
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    finally:
        del proposer.propose
    return [list(o.outputs[0].token_ids) for o in outs], log


def test_fused_and_step_by_step_proposals_agree(default_model_dir):
    llm = _engine(default_model_dir)
    engine, spec = llm.engine, llm.engine.spec
    draft = engine.runner.draft_runner
    assert draft.fused is None  # CPU: no graphs captured
    tok = llm.get_tokenizer()
    # three requests (a padded 4-row layout), then one alone; unequal max_tokens, so the last proposals of the
    # batch have unequal caps and take the step-by-step path
    groups = [[tok.encode(p) for p in (REPETITIVE[0], REPETITIVE[1], PROSE[0])], [tok.encode(REPETITIVE[3])]]
    params = [[SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (30, 27, 30)],
              SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True)]

    engine.spec, engine.runner.draft_runner = None, None  # references: speculation off
    off = [_logged_run_plain(llm, g, p) for g, p in zip(groups, params)]
    engine.spec, engine.runner.draft_runner = spec, draft

    engine.block_manager.reset_prefix_cache()
    step_by_step = [_logged_run(llm, g, p) for g, p in zip(groups, params)]
    assert draft.num_fused_proposals == 0

    engine.block_manager.reset_prefix_cache()
    draft.fused = EagerFused(draft)
    before = (engine.stats.spec.num_draft_tokens_total, engine.stats.spec.num_accepted_tokens_total)
    fused = [_logged_run(llm, g, p) for g, p in zip(groups, params)]

    assert [o for o, _ in fused] == [o for o, _ in step_by_step] == off
    assert [log for _, log in fused] == [log for _, log in step_by_step]  # the same drafts, proposal by proposal
    calls = draft.fused.calls
    assert draft.num_fused_proposals == len(calls) >= 8
    assert (3, 4, K) in calls and (1, 1, K) in calls  # a padded layout and a single request
    proposals = sum(len(log) for _, log in fused)
    assert len(calls) < proposals  # unequal caps near the end: step by step
    drafted = engine.stats.spec.num_draft_tokens_total - before[0]
    accepted = engine.stats.spec.num_accepted_tokens_total - before[1]
    assert accepted >= 0.9 * drafted  # the model as its own draft: fused drafts read the right KV


def _logged_run_plain(llm: LLM, prompts, params) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_switch_turns_fused_proposals_off(monkeypatch):
    assert fused_proposal.enabled()
    monkeypatch.setenv("SPEC_FUSED_PROPOSAL", "0")
    assert not fused_proposal.enabled()

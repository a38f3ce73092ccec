"""`FusedProposal`: a draft model's greedy proposal of n decode-shaped steps (n = 1..k) as one CUDA graph replay.

Why: `DraftModelRunner.propose` ran each draft step as its own decode-graph replay, with the host building
that step's inputs (numpy, seven host-to-device copies, the graph's buffer copies, the logits and argmax
launches) between replays: n host rounds per proposal, each of them on the critical path whenever it takes
longer than the draft's forward on the device (llama-3.2-1b at batch 1: the H200 run at c518670 measured
~1.2 ms per draft token, about twice what its ~2.5 GB of weights take to stream), and the device idle while
the first step's inputs are built. Here the host fills the decode graph's static buffers once (the step-0
inputs) and replays one graph that runs all n steps: step j > 0 takes step j - 1's argmax as its input id,
advances each real row's position and context length by one and computes its KV slot from its block table on
the device (`advance`). Rows past the proposal's requests are padding (slot -1: no KV write, context 1,
position 0, never advanced). A proposal that owes verified positions (after a speculative step) runs its
step 0 as a forward of its own (draft_model_runner.py) and replays the graph of n = k - 1 steps after it,
from step 0's drafts on the device.

Greedy only (every draft the draft model's argmax, as `DraftSampler.draw` gives greedy requests): a proposal
with a random request, requests with different draft caps, more requests than `FUSED_MAX_BATCH`, or a block
table wider than the graphs' falls back to the step-by-step path. The drafts are the same tokens either way
(tests/engine/test_spec_fused_proposal.py runs `run_steps` eagerly on the CPU against the step-by-step path;
tests/engine/test_spec_decode_cuda.py replays the graphs). `SPEC_FUSED_PROPOSAL=0` turns it off (the
step-by-step path, for comparison).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from shared_engine.model_executor.attention.metadata import AttentionMetadata

logger = logging.getLogger("shared_engine")

FUSED_MAX_BATCH = 8  # proposals of at most this many requests (batch sizes where speculation pays)


def enabled() -> bool:
    return os.environ.get("SPEC_FUSED_PROPOSAL", "1") != "0"


def fill(graphs, rows: int, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> None:
    """The step-0 inputs of a decode-only step of `n = input_ids.shape[0]` requests in the decode layout of
    `graphs` (a `CudaGraphRunner`'s static buffers) for a `rows`-row graph: rows [0, n) the requests, rows
    [n, rows) padding (slot -1, context 1, position 0)."""
    n, width = input_ids.shape[0], meta.block_tables.shape[1]
    graphs.input_ids[:n].copy_(input_ids)
    graphs.positions[:n].copy_(positions)
    graphs.positions[n:rows].fill_(0)
    graphs.slot_mapping[:n].copy_(meta.slot_mapping)
    graphs.slot_mapping[n:rows].fill_(-1)
    graphs.context_lens[:n].copy_(meta.context_lens)
    graphs.context_lens[n:rows].fill_(1)
    graphs.block_tables[:n, :width].copy_(meta.block_tables)


def advance(graphs, rows: int, tokens: torch.Tensor, valid: torch.Tensor, block_size: int) -> None:
    """On the device, the static buffers from step j's inputs to step j + 1's: input ids = step j's argmax
    `tokens` [rows] int64, and each real row (`valid` [rows] bool) one position further, its context one
    longer and its slot `block_tables[row, pos // block_size] * block_size + pos % block_size`."""
    graphs.input_ids[:rows].copy_(tokens)
    positions = graphs.positions[:rows]
    positions.add_(valid.to(positions.dtype))
    graphs.context_lens[:rows].add_(valid.to(graphs.context_lens.dtype))
    blocks = graphs.block_tables[:rows].gather(1, (positions // block_size)[:, None]).squeeze(1).to(torch.int64)
    slots = blocks * block_size + positions % block_size
    graphs.slot_mapping[:rows].copy_(torch.where(valid, slots, torch.full_like(slots, -1)))


def run_steps(model, graphs, kv_caches, backend, rows: int, steps: int, block_size: int,
              meta_for_step: Callable[[int], AttentionMetadata]) -> torch.Tensor:
    """`steps` greedy draft steps over the filled static buffers (`fill`): `[steps, rows]` int64, row i of
    step j the draft model's argmax after request i's inputs up to step j. No host synchronisation, so it can
    be captured; `meta_for_step(j)` is step j's metadata over the static buffers (the same tensors each step;
    its host-side lists matter only to the torch backend, which the CPU tests run eagerly)."""
    valid = graphs.slot_mapping[:rows] >= 0
    out = []
    for step in range(steps):
        if step:
            advance(graphs, rows, out[-1], valid, block_size)
        hidden = model(graphs.input_ids[:rows], graphs.positions[:rows], kv_caches, meta_for_step(step), backend)
        out.append(model.compute_logits(hidden).argmax(dim=-1))
    return torch.stack(out)


class FusedProposal:
    """CUDA graphs of `run_steps`, one per (rows, steps) for the draft's decode graph sizes up to
    FUSED_MAX_BATCH and steps 1..k (k when a proposal owes no verified positions, fewer after its step 0), in
    the memory pool of the draft's own graphs (`graphs`)."""

    def __init__(self, model, graphs, kv_caches, backend, k: int, block_size: int, device: torch.device) -> None:
        self.graphs_runner = graphs
        self.block_size = block_size
        self.sizes = [s for s in graphs.decode_sizes if s <= FUSED_MAX_BATCH]
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        pool = next(iter(graphs.graphs.values())).pool() if graphs.graphs else None
        for rows in reversed(self.sizes):
            for steps in range(k, 0, -1):
                self._padding(rows)
                args = (model, graphs, kv_caches, backend, rows, steps, block_size,
                        lambda _j, rows=rows: graphs._meta(rows, 0, False))
                run_steps(*args)  # warm-up (every row padding: nothing written)
                torch.cuda.synchronize(device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[rows, steps] = run_steps(*args)
                pool = graph.pool()
                self.graphs[rows, steps] = graph
        torch.cuda.synchronize(device)

    def _padding(self, rows: int) -> None:
        g = self.graphs_runner
        g.slot_mapping[:rows].fill_(-1)
        g.context_lens[:rows].fill_(1)
        g.positions[:rows].fill_(0)

    def select(self, n: int, steps: int, table_width: int) -> tuple[int, int] | None:
        """The graph for n requests and `steps` draft steps, or None (the step-by-step path)."""
        if steps < 1 or table_width > self.graphs_runner.block_tables.shape[1]:
            return None
        rows = next((s for s in self.sizes if s >= n), None)
        return None if rows is None or (rows, steps) not in self.graphs else (rows, steps)

    def run(self, key: tuple[int, int], input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """Replay graph `key` from step-0 inputs of n requests: `[steps, n]` int64 drafts (on the device)."""
        rows, _ = key
        fill(self.graphs_runner, rows, input_ids, positions, meta)
        self.graphs[key].replay()
        return self.outputs[key][:, :input_ids.shape[0]]

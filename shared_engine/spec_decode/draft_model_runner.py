"""`DraftModelRunner`: the `draft_model` proposer's model and its paged KV cache, on the target's block tables.

The draft's KV pool has the target's `num_blocks` blocks, indexed by the same block ids (so the block manager
allocates once, for both models, and knows nothing of the draft), plus `num_scratch_blocks` blocks past them.
Two kinds of forward pass write it:

- `mirror(inputs, out)`, run by the target's `ModelRunner.launch` after every target forward with that step's
  own inputs (tokens, positions, slot mapping, block tables): every position whose target KV a step computes
  gets its draft KV in the same slot. So the draft's cache is valid wherever the target's is: prompt chunks
  (the draft prefills when the target does), prefix-cache hits (the blocks were mirrored when computed),
  recompute after preemption, and verified drafts. A rejected draft's slot is rewritten later, like the
  target's. Except where speculation is off: a step of plain decodes only (no drafts, one token per request:
  what the auto policy runs at large batch) is not mirrored, so the draft costs nothing while it is off; the
  blocks those decodes wrote are marked stale (`stale_blocks`), and so is every block a request writes after
  one of its own stale blocks (its draft KV there saw a stale context). Before a request's next proposal the
  draft recomputes its positions from its first stale block on (`_catch_up`: one chunked forward for all
  such requests), so a proposal always reads valid draft KV, also through prefix-cache hits on blocks
  computed while speculation was off.
- `propose(...)`: k decode-shaped steps batched over the requests, step j feeding each request the token at
  position c + j (c = its computed tokens; step 0 its last verified token, then its own previous draft) and
  taking the argmax as the next draft. Positions from c on are not yet allocated to the request when the
  proposer runs (the scheduler reserves lookahead slots afterwards), so each request's table for these steps
  is its live block table followed by `ceil(k / block_size)` scratch blocks of its own; what the steps write
  there is dropped, and the next step's mirror writes the verified positions into the real blocks.

Drafts (`draft_sampling.py`): a greedy request's are the draft model's argmax (one-hot q); a random
request's are drawn from the draft's distribution q under the request's temperature / top-k / top-p / min-p,
and that q goes to the rejection sampler (`draft_probs`), so verification stays exact for both. The next
input is read on the device (the placeholder path of async scheduling), so a proposal waits for the device
once, for all k steps. On CUDA
both kinds of forward replay the draft's own CUDA graphs where a step fits one (decode graphs for proposals;
decode, mixed and varlen graphs for the mirror), captured like the target's (`ModelRunner.capture_cuda_graphs`)
once its cache is allocated; their memory pool is not in the memory profile. A greedy proposal of up to
`fused_proposal.FUSED_MAX_BATCH` requests with one draft cap replays a single graph for all its steps
(`fused_proposal.py`: no host work between the draft steps).
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from shared_engine.config.lora_config import LoRAConfig
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.model_executor.input_builder import StepInputs, build_inputs
from shared_engine.spec_decode import fused_proposal
from shared_engine.spec_decode.draft_sampling import DraftSampler

logger = logging.getLogger("shared_engine")


class DraftModelRunner:
    def __init__(self, engine_config, source, num_speculative_tokens: int) -> None:
        """Load the draft (`source`, a `ModelSource`) on the target's device and dtype: real weights from a
        directory, random ones from a preset or when the target itself is dummy.

        Raises:
            ValueError: the draft supports fewer positions than `max_model_len`.
        """
        from shared_engine.model_executor.model_runner import ModelRunner

        max_model_len = engine_config.model.max_model_len
        if source.arch.max_position_embeddings < max_model_len:
            raise ValueError(f"draft model {source.name!r} supports {source.arch.max_position_embeddings} positions, "
                             f"fewer than max_model_len {max_model_len}")
        dummy = source.path is None or engine_config.model.load_format == "dummy"
        model = dataclasses.replace(engine_config.model, model=source.name, tokenizer=None,
                                    load_format="dummy" if dummy else "auto")
        # the speculative section stays: the draft's varlen graphs (mirrors of speculative steps) are sized by k
        config = dataclasses.replace(engine_config, model=model, lora=LoRAConfig())
        self.runner = ModelRunner(config, source)  # the draft's weights, dtype, device and attention backend
        self.model, self.device, self.backend = self.runner.model, self.runner.device, self.runner.backend
        self.block_size = config.cache.block_size
        self.k = num_speculative_tokens
        self.scratch_per_request = -(-self.k // self.block_size)  # blocks past the live table a proposal can reach
        self.num_scratch_blocks = config.scheduler.max_num_seqs * self.scratch_per_request
        self.num_blocks = 0
        self.token_budget = min(config.scheduler.token_budget, max_model_len)  # tokens of one catch-up forward
        self.num_mirrored_tokens = 0  # tokens the mirror has run (every target step's but plain-decode ones)
        self.num_skipped_steps = 0  # plain-decode steps not mirrored (speculation off)
        self.num_caught_up_tokens = 0  # positions recomputed before proposals (`_catch_up`)
        self.num_proposal_steps = 0  # decode-shaped draft forwards of proposals
        self.num_fused_proposals = 0  # proposals whose steps all ran in one graph replay (fused_proposal.py)
        self.fused: fused_proposal.FusedProposal | None = None  # CUDA: the greedy multi-step proposal graphs
        # CUDA: device seconds of proposals (first draft kernel to the last argmax) and of mirror forwards
        # (CUDA events; a mirror's are read at the next proposal, once the device has passed them)
        self.propose_gpu_seconds = 0.0
        self.mirror_gpu_seconds = 0.0
        self._mirror_spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.stale_blocks: set[int] = set()  # block ids whose draft KV is not valid
        self.sampler = DraftSampler(engine_config.model.seed)
        self.num_sampled_drafts = 0  # draft tokens drawn at random (temperature > 0), with their q
        logger.info("Draft model %s loaded (%s weights, %d layers, %s, %s) in %.1f s", source.name,
                    "dummy" if dummy else "real", source.arch.num_layers, self.runner.dtype_name, self.device,
                    self.runner.load_seconds)

    @property
    def kv_bytes_per_block(self) -> int:
        """Bytes of one draft KV block (what the memory profile adds to the target's per block)."""
        return self.runner.kv_bytes_per_block

    @property
    def scratch_bytes(self) -> int:
        return self.num_scratch_blocks * self.kv_bytes_per_block

    @torch.inference_mode()
    def profile_run(self, num_tokens: int) -> None:
        """CUDA, inside the target's memory profile (`ModelRunner.free_kv_bytes`): the draft's peak activations,
        a forward of `num_tokens` (what a mirror or a catch-up runs at most) and a proposal step's logits for
        `max_num_seqs` rows."""
        self.runner._profile_run(num_tokens)
        rows = self.runner.config.scheduler.max_num_seqs
        hidden = torch.zeros((rows, self.runner.arch.hidden_size), dtype=self.runner.dtype, device=self.device)
        self.model.compute_logits(hidden).argmax(dim=-1)
        torch.cuda.synchronize(self.device)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """The target's `num_blocks` (same ids) and the scratch blocks after them; then (CUDA) the graphs. No
        host tier: with `kv_offload_size` only the target's KV is offloaded, so a block brought back holds stale
        draft KV (fewer drafts accepted for it, outputs unchanged: verification decides)."""
        self.num_blocks = num_blocks
        self.runner.allocate_kv_cache(num_blocks + self.num_scratch_blocks, with_host_tier=False)
        self.runner.capture_cuda_graphs()
        graphs = self.runner.graph_runner
        if graphs is not None and graphs.decode_sizes and self.k > 1 and fused_proposal.enabled():
            try:
                with torch.inference_mode():
                    self.fused = fused_proposal.FusedProposal(self.model, graphs, self.runner.kv_caches, self.backend,
                                                              self.k, self.block_size, self.device)
            except Exception:  # the step-by-step path stays correct; say why the fast one is missing
                logger.exception("draft model: multi-step proposal graphs not captured; proposing step by step")
                self.fused = None

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        """Hidden states `[num_tokens, hidden]`: a graph replay where the step fits one, else eager."""
        graphs = self.runner.graph_runner
        key = None if graphs is None else graphs.select(inputs.meta, inputs.input_ids.shape[0])
        if key is not None:
            self.runner.graph_steps += 1
            return graphs.run(key, inputs.input_ids, inputs.positions, inputs.meta)
        return self.model(inputs.input_ids, inputs.positions, self.runner.kv_caches, inputs.meta, self.backend)

    @torch.inference_mode()
    def mirror(self, inputs: StepInputs, out: SchedulerOutput) -> None:
        """Run the draft over a target step's inputs (after their placeholders were patched), writing its KV
        at the step's slots; no logits. A step of plain decodes only is skipped (its blocks marked stale)."""
        stale, bs = self.stale_blocks, self.block_size
        if not out.num_draft_tokens and all(item.num_new_tokens == 1 for item in out.scheduled):
            for item in out.scheduled:
                stale.add(item.block_table[item.start_position // bs])
            self.num_skipped_steps += 1
            return
        if stale:  # blocks written after a stale one of the same request are stale, the others now valid
            for item in out.scheduled:
                table, first = item.block_table, item.start_position // bs
                written = table[first:(item.context_len - 1) // bs + 1]
                # the block the row starts in counts unless the row starts it (a fresh block: what a previous
                # owner left there is overwritten from its first slot)
                before = table[:first + (item.start_position % bs > 0)]
                if any(b in stale for b in before):
                    stale.update(written)
                else:
                    stale.difference_update(written)
        span = self._events()
        self._forward(inputs)
        if span is not None:
            span[1].record()
            while self._mirror_spans and self._mirror_spans[0][1].query():  # done ones now (none waits)
                start, end = self._mirror_spans.pop(0)
                self.mirror_gpu_seconds += start.elapsed_time(end) / 1e3
            self._mirror_spans.append(span)
        self.num_mirrored_tokens += inputs.input_ids.shape[0]

    def _events(self) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        """CUDA: a (start, end) pair of timing events, the start recorded now; None elsewhere."""
        if self.device.type != "cuda":
            return None
        span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        span[0].record()
        return span

    def _first_stale_position(self, table: list[int], num_tokens: int) -> int | None:
        """The first position (a block start) below `num_tokens` whose draft KV may be stale, or None."""
        for i, block in enumerate(table[:-(-num_tokens // self.block_size)]):
            if block in self.stale_blocks:
                return i * self.block_size
        return None

    def _catch_up(self, requests: list, rows: list[int], block_table) -> None:
        """Recompute the draft KV of each request in `rows` from its first stale block to its computed length
        (its tokens there are all known: it decodes next), in one forward; those blocks are valid after."""
        pending = []  # (request, tokens still to recompute, their first position, live table)
        for i in rows:
            r = requests[i]
            table = list(block_table(r.request_id))
            start = self._first_stale_position(table, r.num_computed_tokens)
            if start is not None:
                pending.append((r, [*r.prompt_token_ids, *r.output_token_ids][start:r.num_computed_tokens], start,
                                table))
        bs = self.block_size
        while pending:  # forwards of at most the token budget (the memory profile's size), a piece per request
            items, rest, used = [], [], 0
            for r, tokens, start, table in pending:
                n = min(len(tokens), self.token_budget - used)
                if n > 0:
                    items.append(ScheduledRequest(r, tokens[:n], start, table, False))
                    used += n
                if n < len(tokens):
                    rest.append((r, tokens[max(n, 0):], start + max(n, 0), table))
            self._forward(build_inputs(SchedulerOutput(items, num_batched_tokens=used), bs, self.device))
            self.num_caught_up_tokens += used
            for item in items:
                self.stale_blocks.difference_update(item.block_table[item.start_position // bs:
                                                                     (item.context_len - 1) // bs + 1])
            pending = rest

    @torch.inference_mode()
    def propose(self, requests: list, caps: list[int], block_table) -> list[list[int]]:
        """Up to caps[i] draft tokens for each request (decoding: its last token known, not computed), its
        argmax or drawn from q (`DraftSampler`); `block_table(request_id)` is its live block table.

        Raises:
            RuntimeError: more requests than the scratch blocks were sized for (max_num_seqs).
        """
        drafts: list[list[int]] = [[] for _ in requests]
        rows = [i for i, cap in enumerate(caps) if cap > 0]
        if not rows:
            return drafts
        if len(rows) * self.scratch_per_request > self.num_scratch_blocks:
            raise RuntimeError(f"{len(rows)} requests to draft for, but scratch blocks for {self.num_scratch_blocks}")
        if self.stale_blocks:
            self._catch_up(requests, rows, block_table)
        tables = {}
        for slot, i in enumerate(rows):
            r = requests[i]
            live = block_table(r.request_id)
            last = r.num_computed_tokens + caps[i] - 1  # the last position a draft step writes
            need = max(0, last // self.block_size + 1 - len(live))
            first = self.num_blocks + slot * self.scratch_per_request
            tables[i] = list(live) + list(range(first, first + need))
        span = self._events()
        steps = max(caps[i] for i in rows)
        if self.fused is not None and all(caps[i] == steps for i in rows) and all(
                requests[i].sampling_params.greedy for i in rows):
            items = [ScheduledRequest(requests[i], [requests[i].output_token_ids[-1]], requests[i].num_computed_tokens,
                                      tables[i], True) for i in rows]
            inputs = build_inputs(SchedulerOutput(items, num_batched_tokens=len(items)), self.block_size, self.device)
            key = self.fused.select(len(rows), steps, inputs.meta.block_tables.shape[1])
            if key is not None:
                tokens = self.fused.run(key, inputs.input_ids, inputs.positions, inputs.meta)  # [steps, len(rows)]
                self._end_span(span)
                for i, row in zip(rows, tokens.T.tolist()):  # the one wait for the device
                    drafts[i] = row
                self._read_spans(span)
                self.num_proposal_steps += steps
                self.num_fused_proposals += 1
                self.runner.graph_steps += 1
                return drafts
        outputs = []  # (request indices, [len] int64 draft tokens on the device) per step
        active, previous = rows, None
        for step in range(max(caps[i] for i in rows)):
            if step:
                position = {i: row for row, i in enumerate(active)}  # row of each request in `previous`
                active = [i for i in active if caps[i] > step]
                if not active:
                    break
            # step 0 feeds the last verified token; later steps a placeholder for the previous step's row
            items = [ScheduledRequest(requests[i], [-(position[i] + 1) if step else requests[i].output_token_ids[-1]],
                                      requests[i].num_computed_tokens + step, tables[i], True) for i in active]
            inputs = build_inputs(SchedulerOutput(items, num_batched_tokens=len(items)), self.block_size, self.device)
            inputs.patch_placeholders(previous)
            hidden = self._forward(inputs)
            logits = self.model.compute_logits(hidden[inputs.sample_indices])  # [len(active), vocab]
            previous, random, q = self.sampler.draw(logits, [requests[i] for i in active])  # [len(active)]
            outputs.append((active, previous, random, q))
            self.num_proposal_steps += 1
        self._end_span(span)
        tokens = torch.cat([t for _, t, _, _ in outputs]).tolist()  # the one wait for the device
        self._read_spans(span)
        offset = 0
        q_rows: dict[int, list[torch.Tensor]] = {}
        for indices, _, random, q in outputs:
            for i, token in zip(indices, tokens[offset:offset + len(indices)]):
                drafts[i].append(token)
            for row, position in enumerate(random):
                q_rows.setdefault(indices[position], []).append(q[row])
            offset += len(indices)
        for i, rows_of_q in q_rows.items():
            self.sampler.keep(requests[i].request_id, drafts[i], rows_of_q)
            self.num_sampled_drafts += len(rows_of_q)
        return drafts

    @staticmethod
    def _end_span(span) -> None:
        if span is not None:
            span[1].record()

    def _read_spans(self, span) -> None:
        """After the proposal's wait: its device seconds, and those of the mirror forwards before it."""
        if span is None:
            return
        self.propose_gpu_seconds += span[0].elapsed_time(span[1]) / 1e3
        for start, end in self._mirror_spans:
            self.mirror_gpu_seconds += start.elapsed_time(end) / 1e3
        self._mirror_spans.clear()

    def draft_probs(self, requests: list, drafts: list[list[int]]) -> torch.Tensor | None:
        """q for the rejection sampler (`DraftSampler.draft_probs`), or None when every draft is one-hot."""
        return self.sampler.draft_probs(requests, drafts)

    def release(self, request_id: str) -> None:
        self.sampler.release(request_id)

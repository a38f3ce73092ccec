"""`DraftModelRunner`: the `draft_model` proposer's model and its paged KV cache, on the target's block tables.

The draft's KV pool has the target's `num_blocks` blocks, indexed by the same block ids (so the block manager
allocates once, for both models, and knows nothing of the draft), plus `num_scratch_blocks` blocks past them.
Every position whose target KV a step computes gets its draft KV in the same slot, so the draft's cache is
valid wherever the target's is (prompt chunks, prefix-cache hits, recompute after preemption, verified
drafts); `DraftKVValidity` (draft_kv_validity.py) keeps the books. Two kinds of forward pass write it:

- `mirror(inputs, out)`, run by the target's `ModelRunner.launch` after every target forward with that step's
  own inputs: a step with a prompt chunk runs through the draft there and then (the draft prefills when the
  target does). A step of decodes only (speculative or not) does not: the draft KV of its verified positions
  is owed to the request's next proposal, whose first draft step computes it (below). So a speculative step
  costs the draft no forward of its own, and while speculation is off (plain decodes at large batch) the
  draft costs nothing; blocks owed but never taken are marked stale, and before a request's next proposal
  reads them the draft recomputes its positions from its first stale block on (`_catch_up`: one chunked
  forward for all such requests), also through prefix-cache hits on blocks computed while speculation was off.
- `propose(...)`: k steps batched over the requests. Step 0 feeds each request its tokens from its first owed
  position p (`DraftKVValidity.first_position`: the start of the verify step just run, or its last verified
  token alone) to its last verified token at position c (its computed tokens), so it writes the verified
  positions' draft KV and takes its first draft from the last one (query length c - p + 1 <= k + 2; one
  forward, a mixed or varlen CUDA graph on CUDA). Step j > 0 is decode-shaped: each request's own previous
  draft at position c + j. Positions from c on are not yet allocated to the request when the proposer runs
  (the scheduler reserves lookahead slots afterwards), so each request's table for these steps is its live
  block table followed by `ceil(k / block_size)` scratch blocks of its own; what the steps write there is
  dropped, and the next proposal's step 0 writes the verified positions into the real blocks.

Drafts (`draft_sampling.py`): a greedy request's are the draft model's argmax (one-hot q); a random
request's are drawn from the draft's distribution q under the request's temperature / top-k / top-p / min-p,
and that q goes to the rejection sampler (`draft_probs`), so verification stays exact for both. The next
input is read on the device (the placeholder path of async scheduling), so a proposal waits for the device
once, for all k steps. On CUDA both kinds of forward replay the draft's own CUDA graphs where a step fits one
(decode graphs, and mixed and varlen graphs for step 0 and the mirror, the latter for queries up to k + 2),
captured like the target's (`ModelRunner.capture_cuda_graphs`) once its cache is allocated; their memory pool
is not in the memory profile. A greedy proposal of up to `fused_proposal.FUSED_MAX_BATCH` requests with one
draft cap replays a single graph for its decode-shaped steps (`fused_proposal.py`: no host work between
them): all k when nothing is owed, else the k - 1 after step 0.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

from shared_engine.config.lora_config import LoRAConfig
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.model_executor.input_builder import StepInputs, build_inputs
from shared_engine.spec_decode import fused_proposal
from shared_engine.spec_decode.draft_kv_validity import DraftKVValidity, deferrable
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
        # the draft's varlen graphs hold queries of k + 2 tokens (a proposal's step 0 after a verify step of k + 1),
        # k + 1 where k is the configuration's largest
        spec = dataclasses.replace(engine_config.speculative_config,
                                   num_speculative_tokens=min(num_speculative_tokens + 1, 16))
        section = dataclasses.replace(engine_config.speculative, speculative_config=spec)
        # no nano-batches for the draft: its small GEMMs would read its weights twice for nothing to overlap
        device = dataclasses.replace(engine_config.device, nano_batch_min_decodes=0)
        config = dataclasses.replace(engine_config, model=model, lora=LoRAConfig(), speculative=section, device=device)
        self.runner = ModelRunner(config, source)  # the draft's weights, dtype, device and attention backend
        self.model, self.device, self.backend = self.runner.model, self.runner.device, self.runner.backend
        self.block_size = config.cache.block_size
        self.k = num_speculative_tokens
        self.scratch_per_request = -(-self.k // self.block_size)  # blocks past the live table a proposal can reach
        self.num_scratch_blocks = config.scheduler.max_num_seqs * self.scratch_per_request
        self.num_blocks = 0
        self.token_budget = min(config.scheduler.token_budget, max_model_len)  # tokens of one catch-up forward
        self.num_mirror_forwards = 0  # target steps the mirror ran through the draft (those with a prompt chunk)
        self.num_mirrored_tokens = 0  # their tokens
        self.num_skipped_steps = 0  # steps of plain decodes not mirrored (speculation off)
        self.num_deferred_steps = 0  # speculative steps of decodes not mirrored (owed to the next proposals)
        self.num_caught_up_tokens = 0  # positions recomputed before proposals (`_catch_up`)
        self.num_owed_tokens = 0  # verified positions computed by proposals' step 0 (beside the last token)
        self.num_proposal_steps = 0  # draft forwards of proposals (step 0 and the decode-shaped ones)
        self.num_fused_proposals = 0  # proposals whose steps all ran in one graph replay (fused_proposal.py)
        self.fused: fused_proposal.FusedProposal | None = None  # CUDA: the greedy multi-step proposal graphs
        # CUDA: device seconds of proposals (first draft kernel to the last argmax), of their step 0 where it ran
        # as a forward of its own (not inside a fused graph: what computes the owed positions) and of mirror
        # forwards (CUDA events; a mirror's are read at the next proposal, once the device has passed them)
        self.propose_gpu_seconds = 0.0
        self.first_step_gpu_seconds = 0.0
        self.mirror_gpu_seconds = 0.0
        self._mirror_spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.validity = DraftKVValidity(self.block_size)
        self.stale_blocks = self.validity.stale_blocks  # block ids whose draft KV may be wrong (the same set)
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
        """A target step's draft KV (its inputs after their placeholders were patched): a step with a prompt
        chunk runs through the draft now, writing its KV at the step's slots (no logits); a speculative step of
        decodes only is owed to the requests' next proposals, a step of plain decodes only leaves its blocks
        stale (`DraftKVValidity`)."""
        if deferrable(out.scheduled):
            if out.num_draft_tokens:
                self.validity.on_owed(out.scheduled)
                self.num_deferred_steps += 1
            else:
                self.validity.on_plain_decodes(out.scheduled)
                self.num_skipped_steps += 1
            return
        self.validity.on_mirrored(out.scheduled)
        span = self._events()
        self._forward(inputs)
        if span is not None:
            span[1].record()
            while self._mirror_spans and self._mirror_spans[0][1].query():  # done ones now (none waits)
                start, end = self._mirror_spans.pop(0)
                self.mirror_gpu_seconds += start.elapsed_time(end) / 1e3
            self._mirror_spans.append(span)
        self.num_mirror_forwards += 1
        self.num_mirrored_tokens += inputs.input_ids.shape[0]

    def _events(self) -> tuple[torch.cuda.Event, torch.cuda.Event] | None:
        """CUDA: a (start, end) pair of timing events, the start recorded now; None elsewhere."""
        if self.device.type != "cuda":
            return None
        span = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        span[0].record()
        return span

    def _first_positions(self, requests: list, rows: list[int], live: dict[int, list[int]]) -> dict[int, int]:
        """Each row's first position for step 0 (`DraftKVValidity.first_position`): owed positions up to k + 2
        tokens in all (a verify step's k + 1 and the bonus token) ride step 0 while the step stays within the
        token budget; longer spans (stale blocks) are recomputed first (`_catch_up`) and step 0 feeds the last
        token alone."""
        starts, catch = {}, []
        for i in rows:
            r = requests[i]
            c = r.num_computed_tokens
            starts[i] = self.validity.first_position(r.request_id, live[i], c)
            if c - starts[i] + 1 > self.k + 2:
                catch.append(i)
        if sum(requests[i].num_computed_tokens - starts[i] + 1 for i in rows) > self.token_budget:
            catch = [i for i in rows if starts[i] < requests[i].num_computed_tokens]
        if catch:
            self._catch_up([(requests[i], starts[i], live[i]) for i in catch])
            for i in catch:
                starts[i] = requests[i].num_computed_tokens
        return starts

    def _catch_up(self, pending: list) -> None:
        """Recompute the draft KV of each (request, first position, live table) from that position to its
        computed length (its tokens there are all known: it decodes next), in forwards of at most the token
        budget (the memory profile's size); those blocks are valid after."""
        pending = [(r, r.token_ids_slice(start, r.num_computed_tokens), start, table) for r, start, table in pending]
        while pending:  # a piece per request per forward
            items, rest, used = [], [], 0
            for r, tokens, start, table in pending:
                n = min(len(tokens), self.token_budget - used)
                if n > 0:
                    items.append(ScheduledRequest(r, tokens[:n], start, table, False))
                    used += n
                if n < len(tokens):
                    rest.append((r, tokens[max(n, 0):], start + max(n, 0), table))
            self._forward(build_inputs(SchedulerOutput(items, num_batched_tokens=used), self.block_size, self.device,
                                  staging=self.runner.staging, max_decode_rows=self.runner.max_decode_rows))
            self.num_caught_up_tokens += used
            for item in items:
                self.validity.computed(item.block_table, item.start_position, item.context_len)
            pending = rest

    def _tables(self, requests: list, caps: list[int], rows: list[int], live: dict) -> dict[int, list[int]]:
        """Each row's table for the proposal: its live one and the scratch blocks its draft steps reach."""
        tables = {}
        for slot, i in enumerate(rows):
            last = requests[i].num_computed_tokens + caps[i] - 1  # the last position a draft step writes
            need = max(0, last // self.block_size + 1 - len(live[i]))
            first = self.num_blocks + slot * self.scratch_per_request
            tables[i] = live[i] + list(range(first, first + need))
        return tables

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
        live = {i: list(block_table(requests[i].request_id)) for i in rows}
        starts = self._first_positions(requests, rows, live)
        computed = {i: requests[i].num_computed_tokens for i in rows}
        rows.sort(key=lambda i: starts[i] < computed[i])  # one-token rows first (build_inputs' decodes first)
        tables = self._tables(requests, caps, rows, live)
        items = [ScheduledRequest(requests[i], requests[i].token_ids_slice(starts[i], computed[i] + 1), starts[i],
                                  tables[i], True) for i in rows]
        inputs = build_inputs(SchedulerOutput(items, num_batched_tokens=sum(len(t.token_ids) for t in items)),
                              self.block_size, self.device, staging=self.runner.staging,
                              max_decode_rows=self.runner.max_decode_rows, short_chunks_as_rows=True)
        for i in rows:
            self.validity.computed(live[i], starts[i], computed[i])
            self.num_owed_tokens += computed[i] - starts[i]
        steps = max(caps[i] for i in rows)
        fusable = self.fused is not None and all(caps[i] == steps for i in rows) and all(
            requests[i].sampling_params.greedy for i in rows)
        span = self._events()
        outputs = None  # (request indices, [len] int64 draft tokens on the device, random rows, their q) per step
        if fusable and inputs.input_ids.shape[0] == len(rows):  # nothing owed: every step in one graph
            outputs = self._fused(requests, rows, steps, inputs, None)
        first = None
        if outputs is None:
            outputs = [self._first_step(requests, rows, inputs)]
            first = self._events()
            rest = None
            if fusable and steps > 1:
                rest = self._fused(requests, rows, steps - 1, None, (tables, computed, outputs[0][1]))
            outputs += rest if rest is not None else self._steps(requests, caps, rows, tables, outputs[0][1])
        self._end_span(span)
        tokens = torch.cat([t for _, t, _, _ in outputs]).tolist()  # the one wait for the device
        self._read_spans(span, first)
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

    def _first_step(self, requests: list, rows: list[int], inputs: StepInputs) -> tuple:
        """Step 0 as a forward of its own: the owed positions' draft KV and each row's first draft."""
        hidden = self._forward(inputs)
        logits = self.model.compute_logits(hidden[inputs.sample_indices])  # [len(rows), vocab]
        tokens, random, q = self.sampler.draw(logits, [requests[i] for i in rows])  # [len(rows)]
        self.num_proposal_steps += 1
        return rows, tokens, random, q

    def _fused(self, requests: list, rows: list[int], steps: int, inputs: StepInputs | None, after) -> list | None:
        """`steps` greedy decode-shaped steps in one graph replay (`fused_proposal`), or None where no graph fits:
        from step 0's `inputs`, or `after` = (tables, computed tokens, step 0's drafts `[len(rows)]` on the
        device) from step 1 on."""
        if after is not None:
            tables, computed, tokens = after
            items = [ScheduledRequest(requests[i], [0], computed[i] + 1, tables[i], True) for i in rows]
            inputs = build_inputs(SchedulerOutput(items, num_batched_tokens=len(items)), self.block_size, self.device,
                                  staging=self.runner.staging, max_decode_rows=self.runner.max_decode_rows)
        key = self.fused.select(len(rows), steps, inputs.meta.block_tables.shape[1])
        if key is None:
            return None
        out = self.fused.run(key, inputs.input_ids if after is None else tokens, inputs.positions, inputs.meta)
        self.num_proposal_steps += steps
        self.num_fused_proposals += 1
        self.runner.graph_steps += 1
        return [(rows, out[j], [], None) for j in range(steps)]  # out: [steps, len(rows)]

    def _steps(self, requests: list, caps: list[int], rows: list[int], tables: dict, previous: torch.Tensor) -> list:
        """Steps 1 .. max cap - 1 one forward each, from step 0's drafts `previous` `[len(rows)]` (on the device)."""
        outputs, active = [], rows
        for step in range(1, max(caps[i] for i in rows)):
            position = {i: row for row, i in enumerate(active)}  # row of each request in `previous`
            active = [i for i in active if caps[i] > step]
            if not active:
                break
            # a placeholder for the request's row of the previous step, read on the device
            items = [ScheduledRequest(requests[i], [-(position[i] + 1)], requests[i].num_computed_tokens + step,
                                      tables[i], True) for i in active]
            inputs = build_inputs(SchedulerOutput(items, num_batched_tokens=len(items)), self.block_size, self.device,
                                  staging=self.runner.staging, max_decode_rows=self.runner.max_decode_rows)
            inputs.patch_placeholders(previous)
            hidden = self._forward(inputs)
            logits = self.model.compute_logits(hidden[inputs.sample_indices])  # [len(active), vocab]
            previous, random, q = self.sampler.draw(logits, [requests[i] for i in active])  # [len(active)]
            outputs.append((active, previous, random, q))
            self.num_proposal_steps += 1
        return outputs

    @staticmethod
    def _end_span(span) -> None:
        if span is not None:
            span[1].record()

    def _read_spans(self, span, first) -> None:
        """After the proposal's wait: its device seconds (and its step 0's, to `first`'s start, where step 0 ran
        as a forward of its own), and those of the mirror forwards before it."""
        if span is None:
            return
        self.propose_gpu_seconds += span[0].elapsed_time(span[1]) / 1e3
        if first is not None:
            self.first_step_gpu_seconds += span[0].elapsed_time(first[0]) / 1e3
        for start, end in self._mirror_spans:
            self.mirror_gpu_seconds += start.elapsed_time(end) / 1e3
        self._mirror_spans.clear()

    def draft_probs(self, requests: list, drafts: list[list[int]]) -> torch.Tensor | None:
        """q for the rejection sampler (`DraftSampler.draft_probs`), or None when every draft is one-hot."""
        return self.sampler.draft_probs(requests, drafts)

    def release(self, request_id: str) -> None:
        self.sampler.release(request_id)
        self.validity.release(request_id)

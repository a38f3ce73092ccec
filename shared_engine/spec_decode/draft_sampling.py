"""`DraftSampler`: the `draft_model` proposer's draws and the draft distributions q they came from.

Greedy requests draft the draft model's argmax (one-hot q, exact argmax equality under verification). A
random request (temperature > 0) draws each draft from q = the draft's distribution after the request's
temperature, top-k, top-p and min-p (`filtered_probs`, renormalised), and the rejection sampler gets that q
(`draft_probs`), so a draft is accepted with probability min(1, p(d) / q(d)) and a rejection draws from
max(p - q, 0): the emitted tokens follow the target's distribution exactly for any q (Leviathan et al. 2023),
and a q close to p accepts more than the argmax would. Draws use the exponential race argmax(q / E) with
E ~ Exp(1) from a stream of their own: a seeded request's from a generator seeded with (seed, choice index,
1), never the one its verification draws from (the target sampler's (seed, index)), so the draft's draws and
the accept test's uniforms are independent and a seeded run repeats; the others from one shared stream.
"""

from __future__ import annotations

import torch

from shared_engine.sampling.device_tensor import to_device
from shared_engine.sampling.sampler import filtered_probs


class DraftSampler:
    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._generators: dict[str, torch.Generator] = {}
        self._shared: dict[torch.device, torch.Generator] = {}
        # request id -> (its drafts, q [len(drafts), vocab] fp32) of the last proposal, for `draft_probs`
        self._probs: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}

    def draw(self, logits: torch.Tensor, requests: list) -> tuple[torch.Tensor, list[int], torch.Tensor | None]:
        """Draft tokens `[rows]` int64 for `logits` `[rows, vocab]` (row i: requests[i]), the rows that were
        drawn at random, and their q `[len(those rows), vocab]` fp32 (None when every row is greedy)."""
        tokens = logits.argmax(dim=-1)
        random = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
        if not random:
            return tokens, random, None
        device = logits.device
        index = to_device(random, torch.long, device)
        q = filtered_probs(logits.index_select(0, index), [requests[i].sampling_params for i in random])
        q = q / q.sum(-1, keepdim=True)
        noise = torch.empty_like(q)
        unseeded = []
        for row, i in enumerate(random):
            if requests[i].sampling_params.seed is None:
                unseeded.append(row)
            else:
                noise[row].exponential_(generator=self._generator(requests[i], device))
        if unseeded:
            rows = to_device(unseeded, torch.long, device)
            shared = torch.empty((len(unseeded), q.shape[1]), device=device)
            noise.index_copy_(0, rows, shared.exponential_(generator=self._shared_gen(device)))
        tokens.index_copy_(0, index, (q / noise).argmax(dim=-1))
        return tokens, random, q

    def keep(self, request_id: str, drafts: list[int], q_rows: list[torch.Tensor]) -> None:
        """Remember a random request's q for the drafts the last proposal gave it."""
        self._probs[request_id] = (tuple(drafts), torch.stack(q_rows))

    def draft_probs(self, requests: list, drafts: list[list[int]]) -> torch.Tensor | None:
        """The rejection sampler's `draft_probs` `[sum(len(d) + 1), vocab]` fp32 for a step verifying `drafts`
        (rows as `RejectionSampler.sample` lays them out; bonus rows 0): a random request's q where its
        drafts are (a prefix of) the last proposal's, one-hot at the draft elsewhere; None when no request
        of the step has a q (every draft one-hot)."""
        entries = []
        for request, d in zip(requests, drafts):
            entry = self._probs.get(request.request_id)
            entries.append(entry[1][:len(d)] if entry is not None and d and tuple(d) == entry[0][:len(d)] else None)
        if all(e is None for e in entries):
            return None
        vocab = next(e for e in entries if e is not None).shape[1]
        device = next(e for e in entries if e is not None).device
        out = torch.zeros((sum(len(d) + 1 for d in drafts), vocab), dtype=torch.float32, device=device)
        one_hot_rows, one_hot_tokens, row = [], [], 0
        for d, q in zip(drafts, entries):
            if q is not None:
                out[row:row + len(d)] = q
            else:
                one_hot_rows += range(row, row + len(d))
                one_hot_tokens += d
            row += len(d) + 1
        if one_hot_rows:
            out[to_device(one_hot_rows, torch.long, device), to_device(one_hot_tokens, torch.long, device)] = 1.0
        return out

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        self._probs.pop(request_id, None)

    def _generator(self, request, device: torch.device) -> torch.Generator:
        gen = self._generators.get(request.request_id)
        if gen is None:
            seed = hash((request.sampling_params.seed, request.index, 1)) & (2**63 - 1)
            gen = self._generators[request.request_id] = torch.Generator(device=device).manual_seed(seed)
        return gen

    def _shared_gen(self, device: torch.device) -> torch.Generator:
        if device not in self._shared:
            self._shared[device] = torch.Generator(device=device).manual_seed(self._seed + 1)
        return self._shared[device]

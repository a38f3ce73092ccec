"""`Sampler`: turns one step's logits into one token per sequence (speculative decodes: `rejection_sampler.py`,
which runs the same processing at every verified position).

Order (as vLLM): raw log-probabilities for the `logprobs` output are taken first (before any
processing); then `LogitsProcessors` (grammar masks, logit_bias, min_tokens, penalties), then greedy rows
take the argmax; the others are divided by temperature,
filtered by top-k, top-p and min-p, and sampled by the exponential race (argmax of p / E, E ~ Exp(1)),
which draws from p exactly. A sequence with a seed owns a `torch.Generator` seeded from (seed, choice
index): its draws depend only on its own history, so `n` choices differ and every run repeats exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared_engine.core.request import Request
from shared_engine.sampling.device_tensor import to_device
from shared_engine.sampling.logits_processors import LogitsProcessors


@dataclass
class SampleResult:
    token_id: int
    logprob: float | None = None
    # [(token_id, logprob)] for the top `logprobs` tokens, highest first, plus the sampled token's rank
    top_logprobs: list[tuple[int, float]] | None = None
    rank: int | None = None


class Sampler:
    def __init__(self, seed: int = 0, processors: LogitsProcessors | None = None) -> None:
        self.processors = processors or LogitsProcessors()
        self._generators: dict[str, torch.Generator] = {}
        self._seed = seed
        self._default: dict[torch.device, torch.Generator] = {}

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        self.processors.release(request_id)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> list[SampleResult]:
        """`logits` `[num_seqs, vocab]` fp32, one row per request (which must need a sample)."""
        tokens, raw_logprobs = self.sample(logits, requests)
        return [r[0] for r in self.results([[t] for t in tokens.tolist()], raw_logprobs, requests)]

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Enqueue the sampling of one token per row without waiting for the device. Returns the token ids
        `[num_seqs]` int64 (on logits' device) and, when a request asked for `logprobs`, the raw
        log-probabilities `[num_seqs, vocab]` fp32 (else None); `results` turns them into `SampleResult`s."""
        raw_logprobs = raw_logprobs_if_asked(logits, requests)
        logits = self.processors.apply(logits, requests)
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, r in enumerate(requests) if not r.sampling_params.greedy]
        if random_rows:
            rows = to_device(random_rows, torch.long, logits.device)
            sampled = self._sample(logits.index_select(0, rows), [requests[i] for i in random_rows])
            tokens.index_copy_(0, rows, sampled)
        return tokens, raw_logprobs

    def results(self, token_ids: list[list[int]], raw_logprobs: torch.Tensor | None, requests: list[Request],
                num_logits: list[int] | None = None) -> list[list[SampleResult]]:
        """`SampleResult`s from a step's outputs, the token ids already on the host: for each request its
        new tokens (one; or a speculative decode's accepted drafts and bonus token), the j-th with the
        target's logprobs at `raw_logprobs` row `first + j`, where `first` is the sum of the earlier
        requests' `num_logits` (each 1 when None)."""
        results, first = [], 0
        for i, (request, tokens) in enumerate(zip(requests, token_ids)):
            results.append([self._result(first + j, t, raw_logprobs, request) for j, t in enumerate(tokens)])
            first += 1 if num_logits is None else num_logits[i]
        return results

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        probs = filtered_probs(logits, [r.sampling_params for r in requests])
        noise = torch.empty_like(probs)
        unseeded = [row for row, r in enumerate(requests) if r.sampling_params.seed is None]
        if unseeded:  # one draw for all rows on the shared stream
            rows = to_device(unseeded, torch.long, logits.device)
            draw = torch.empty((len(unseeded), probs.shape[1]), dtype=probs.dtype, device=probs.device)
            noise.index_copy_(0, rows, draw.exponential_(generator=self._default_gen(logits.device)))
        for row, request in enumerate(requests):
            if request.sampling_params.seed is not None:
                noise[row].exponential_(generator=self._generator(request, logits.device))
        return (probs / noise).argmax(dim=-1)

    def _default_gen(self, device: torch.device) -> torch.Generator:
        if device not in self._default:
            self._default[device] = torch.Generator(device=device).manual_seed(self._seed)
        return self._default[device]

    def _generator(self, request: Request, device: torch.device) -> torch.Generator:
        seed = request.sampling_params.seed
        gen = self._generators.get(request.request_id)
        if gen is None:
            # Distinct, reproducible streams per choice: mix the choice index into the seed.
            gen = torch.Generator(device=device).manual_seed(hash((seed, request.index)) & (2**63 - 1))
            self._generators[request.request_id] = gen
        return gen

    @staticmethod
    def _result(row: int, token: int, raw_logprobs, request: Request) -> SampleResult:
        k = request.sampling_params.logprobs
        if raw_logprobs is None or k is None:
            return SampleResult(token)
        lp = raw_logprobs[row]
        chosen = lp[token]
        rank = int((lp > chosen).sum().item()) + 1
        top = []
        if k > 0:
            values, ids = lp.topk(k)
            top = list(zip(ids.tolist(), values.tolist()))
        return SampleResult(token, float(chosen), top, rank)


def raw_logprobs_if_asked(logits: torch.Tensor, requests) -> torch.Tensor | None:
    """Log-softmax of the unprocessed logits `[rows, vocab]` (vLLM's `logprobs` output), when any row asks."""
    if any(r.sampling_params.logprobs is not None for r in requests):
        return torch.log_softmax(logits, dim=-1)
    return None


def filtered_probs(logits: torch.Tensor, params: list) -> torch.Tensor:
    """Temperature, top-k, top-p, softmax, min-p: the distribution a random row draws from, `[rows, vocab]`
    fp32, unnormalised after min-p (rows sum to <= 1)."""
    vocab = logits.shape[1]
    temps = to_device([p.temperature for p in params], logits.dtype, logits.device)
    logits = logits / temps[:, None]
    logits = _top_k(logits, [p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    logits = _top_p(logits, [p.top_p for p in params])
    probs = torch.softmax(logits, dim=-1)
    return _min_p(probs, [p.min_p for p in params])


def _top_k(logits: torch.Tensor, ks: list[int]) -> torch.Tensor:
    vocab = logits.shape[1]
    if all(k >= vocab for k in ks):
        return logits
    k_max = max(k for k in ks if k < vocab)
    values = logits.topk(k_max, dim=-1).values  # [num_seqs, k_max]
    k = to_device(ks, torch.long, logits.device)
    kth = values.gather(1, (k.clamp(max=k_max) - 1)[:, None]).squeeze(1)
    kth = kth.masked_fill(k >= vocab, -float("inf"))  # rows without top-k keep every token
    return logits.masked_fill(logits < kth[:, None], -float("inf"))


def _top_p(logits: torch.Tensor, ps: list[float]) -> torch.Tensor:
    if all(p >= 1.0 for p in ps):
        return logits
    top_p = to_device(ps, logits.dtype, logits.device)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p: drop a token when the mass before it already does.
    drop = (cum - sorted_logits.softmax(dim=-1)) >= top_p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, -float("inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _min_p(probs: torch.Tensor, min_ps: list[float]) -> torch.Tensor:
    if all(p == 0 for p in min_ps):
        return probs
    min_p = to_device(min_ps, probs.dtype, probs.device)[:, None]
    threshold = min_p * probs.max(-1, keepdim=True).values
    return probs.masked_fill(probs < threshold, 0.0)

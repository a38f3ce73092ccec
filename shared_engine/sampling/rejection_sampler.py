"""`RejectionSampler`: verifies a step's draft tokens against the target model's logits, keeping the target
distribution exactly (Leviathan et al. 2023; Chen et al. 2023; the accept rule is in
`kernels/rejection_sampling.py`).

Per speculative decode with drafts d_1..d_n, the step has n + 1 rows of target logits: row j is the target's
next-token logits after the tokens before d_{j+1} (row n: after d_n, the bonus position). Each row gets the
same processing as a plain decode's (the sampler's `LogitsProcessors`: grammar mask, logit_bias, min_tokens
and penalties over the request's output followed by the drafts before that position, as if they had been
accepted; then temperature, top-k, top-p, min-p), so
the accept test compares the drafts with the distribution plain decoding would sample from at that
position. Greedy rows become one-hot at the processed argmax: exact argmax equality, no random draws.

Random draws, per request in a fixed order (n uniforms, then n + 1 rows of Exp(1) noise for the residual
and bonus draws by the exponential race, argmax(p / E)), come from the request's own generator when it has a
seed (its run repeats exactly) and from the sampler's shared stream otherwise. Logprobs, when asked, are the
target's raw log-softmax at each emitted position, as without speculation.

BENCHMARK ONLY: with `forced` set (`spec_decode/forced_acceptance.py`, from the engine's
`benchmark_forced_acceptance`) the accept kernel's inputs for the replay proposer's requests are overridden
just before it runs, so it accepts exactly the drafts the replay marks right; never set when serving.
"""

from __future__ import annotations

import numpy as np
import torch

from shared_engine.sampling.device_tensor import to_device
from shared_engine.sampling.sampler import Sampler, filtered_probs, raw_logprobs_if_asked


class RejectionSampler:
    def __init__(self, sampler: Sampler, use_kernel: bool) -> None:
        self.sampler = sampler  # its generators: per-request seeds and the shared stream
        self.use_kernel = use_kernel  # the Triton accept kernel (CUDA); else the pure-torch reference
        self.forced = None  # BENCHMARK ONLY: a `ForcedAcceptance` (never set when serving)

    def sample(
        self,
        logits: torch.Tensor,  # [num_rows, vocab] fp32, num_rows = sum(len(d) + 1 for d in drafts)
        requests: list,
        drafts: list[list[int]],  # per request its draft tokens (possibly none)
        draft_probs: torch.Tensor | None = None,  # [num_rows, vocab] fp32 q_j per row (bonus rows ignored)
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns the emitted tokens `[num_requests, k + 1]` int64 (accepted drafts, then the recovered or
        bonus token, then -1; on logits' device, not waited for) and the raw logprobs `[num_rows, vocab]`
        when a request asked for logprobs (else None)."""
        device = logits.device
        counts = [len(d) + 1 for d in drafts]
        rows = [r for r, c in zip(requests, counts) for _ in range(c)]  # the request owning each logits row
        raw_logprobs = raw_logprobs_if_asked(logits, rows)
        logits = self.sampler.processors.apply(logits, rows, [d[:j] for d in drafts for j in range(len(d) + 1)])
        flat_drafts = to_device([t for d in drafts for t in (*d, 0)], torch.long, device)  # bonus rows: 0
        # greedy rows: p is one-hot at the argmax, so p(d) is (d == argmax) and the residual's draw is the argmax
        recovered = logits.argmax(dim=-1)  # [num_rows]
        target_p = (recovered == flat_drafts).to(torch.float32)
        uniforms = torch.zeros_like(target_p)
        q_draft = None if draft_probs is None else draft_probs.gather(1, flat_drafts[:, None]).squeeze(1)
        random = [i for i, r in enumerate(rows) if not r.sampling_params.greedy]
        if random:
            self._random_rows(logits, rows, random, counts, requests, flat_drafts, draft_probs, recovered, target_p,
                              uniforms)
        if self.forced is not None:
            self.forced.override(requests, drafts, target_p, recovered)
        k = max(counts) - 1
        first = np.cumsum([0, *counts[:-1]])
        # [batch, k + 1] row indices: position j of request b, clamped to its bonus row
        index = first[:, None] + np.minimum(np.arange(k + 1)[None, :], np.asarray(counts)[:, None] - 1)
        index = to_device(index.ravel().tolist(), torch.long, device).view(len(requests), k + 1)
        draft_index = index[:, :k]
        args = (flat_drafts[draft_index].contiguous(), to_device([c - 1 for c in counts], torch.int32, device),
                target_p[draft_index].contiguous(), None if q_draft is None else q_draft[draft_index].contiguous(),
                uniforms[draft_index].contiguous(), recovered[index].contiguous())
        if self.use_kernel:
            from kernels.rejection_sampling import rejection_sample

            return rejection_sample(*args), raw_logprobs
        from kernels.rejection_sampling import rejection_sample_ref

        return rejection_sample_ref(*args), raw_logprobs

    def _random_rows(self, logits, rows, random, counts, requests, flat_drafts, draft_probs, recovered, target_p,
                     uniforms) -> None:
        """Fill the random rows' p(d), uniforms and residual / bonus draws (in place): p is the normalised
        filtered distribution, the residual max(p - q, 0) (p without d for a one-hot draft; p itself at the
        bonus row or where the residual vanishes), drawn by the exponential race argmax(residual / E)."""
        device = logits.device
        index = to_device(random, torch.long, device)
        probs = filtered_probs(logits.index_select(0, index), [rows[i].sampling_params for i in random])
        probs = probs / probs.sum(-1, keepdim=True)  # [num_random, vocab]
        drafts = flat_drafts.index_select(0, index)[:, None]
        target_p.index_copy_(0, index, probs.gather(1, drafts).squeeze(1))
        if draft_probs is None:
            residual = probs.scatter(1, drafts, 0.0)
        else:
            residual = (probs - draft_probs.index_select(0, index)).clamp_(min=0.0)
        is_draft_row = [j < c - 1 for c in counts for j in range(c)]
        keep = to_device([is_draft_row[i] for i in random], torch.bool, device)[:, None]
        residual = torch.where(keep & (residual.sum(-1, keepdim=True) > 0), residual, probs)
        u, noise = self._draws(requests, counts, random, probs)
        uniforms.index_copy_(0, index, u)
        recovered.index_copy_(0, index, (residual / noise).argmax(dim=-1))

    def _draws(self, requests: list, counts: list[int], random: list[int],
               probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniforms `[num_random]` and Exp(1) noise `[num_random, vocab]` for the random rows (`random`, row
        indices in request order): a seeded request's from its own generator (its n + 1 uniforms, then its
        noise rows), the rest in one draw from the shared stream."""
        device, vocab = probs.device, probs.shape[1]
        uniforms = torch.empty(len(random), dtype=probs.dtype, device=device)
        noise = torch.empty_like(probs)
        slot = 0
        unseeded = []
        for request, count in zip(requests, counts):
            if not request.sampling_params.greedy:
                if request.sampling_params.seed is None:
                    unseeded.extend(range(slot, slot + count))
                else:
                    gen = self.sampler._generator(request, device)
                    uniforms[slot:slot + count].uniform_(generator=gen)
                    noise[slot:slot + count].exponential_(generator=gen)
                slot += count
        if unseeded:
            gen = self.sampler._default_gen(device)
            index = to_device(unseeded, torch.long, device)
            uniforms.index_copy_(0, index, torch.rand(len(unseeded), device=device, generator=gen))
            noise.index_copy_(0, index, torch.empty((len(unseeded), vocab), device=device).exponential_(generator=gen))
        return uniforms, noise

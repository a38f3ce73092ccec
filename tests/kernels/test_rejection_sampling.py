"""Rejection sampling: the Triton accept kernel against its pure-torch reference, and the whole
`RejectionSampler` against the target distribution (chi-square over many rows at once)."""

from __future__ import annotations

import pytest
import torch

from kernels.rejection_sampling import rejection_sample, rejection_sample_ref
from shared_engine.core.request import Request
from shared_engine.sampling.rejection_sampler import RejectionSampler
from shared_engine.sampling.sampler import Sampler
from shared_engine.sampling_params import SamplingParams


@pytest.mark.parametrize("batch,k,with_q", [(1, 1, False), (5, 3, True), (7, 5, False), (9, 4, True)])
def test_kernel_matches_reference(device, batch, k, with_q):
    gen = torch.Generator().manual_seed(batch * 10 + k)
    drafts = torch.randint(0, 50, (batch, k), generator=gen)
    num = torch.randint(0, k + 1, (batch,), generator=gen).to(torch.int32)
    num[0] = k  # at least one full row
    p = torch.rand(batch, k, generator=gen)
    p[:, 0] = torch.where(torch.arange(batch) % 2 == 0, 1.0, 0.0)  # certain accept / certain reject
    q = torch.rand(batch, k, generator=gen) if with_q else None
    u = torch.rand(batch, k, generator=gen)
    recovered = torch.randint(50, 100, (batch, k + 1), generator=gen)
    args = [t.to(device) if t is not None else None for t in (drafts, num, p, q, u, recovered)]
    expected = rejection_sample_ref(*args)
    assert torch.equal(rejection_sample(*args), expected)
    for b in range(batch):  # emitted: the accepted prefix, one recovered/bonus token, then -1
        emitted = int((expected[b] >= 0).sum())
        assert 1 <= emitted <= int(num[b]) + 1 and (expected[b, emitted:] == -1).all()


def test_kernel_checks_shapes(device):
    z = torch.zeros(2, 3, device=device)
    with pytest.raises(ValueError, match="recovered"):
        rejection_sample(torch.zeros(2, 3, dtype=torch.int64, device=device), torch.zeros(2, dtype=torch.int32,
                         device=device), z, None, z, torch.zeros(2, 3, dtype=torch.int64, device=device))


VOCAB = 6
N = 6000


def _requests(params: SamplingParams, n: int) -> list[Request]:
    return [Request(f"r{i}", [1, 2], params, max_tokens=8) for i in range(n)]


def _target_logits() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    return torch.randn(3, VOCAB, generator=gen) * 1.5  # positions 0, 1, 2 (bonus)


def _check(counts: torch.Tensor, probs: torch.Tensor) -> None:
    chisquare = pytest.importorskip("scipy.stats").chisquare
    expected = probs.double() / probs.double().sum() * counts.sum()
    assert chisquare(counts.double().numpy(), expected.numpy()).pvalue > 0.001, (counts, expected)


@pytest.mark.parametrize("draft_kind", ["one_hot", "draft_probs"])
def test_emitted_tokens_follow_the_target(draft_kind):
    """Two drafts per request, the target's rows fixed: the first emitted token ~ p_0, the second (when the
    first draft was accepted) ~ p_1, whatever the drafts, for one-hot drafts and for drafts drawn from q."""
    logits = _target_logits()
    temperature = 0.9
    p = torch.softmax(logits / temperature, dim=-1)
    gen = torch.Generator().manual_seed(5)
    q_rows = torch.softmax(torch.randn(2, VOCAB, generator=gen), dim=-1)  # a draft that often disagrees
    drafts = [torch.multinomial(q_rows[j], N, replacement=True, generator=gen).tolist() for j in range(2)]
    drafts = [[drafts[0][i], drafts[1][i]] for i in range(N)]
    rows = logits.repeat(N, 1)  # [N * 3, vocab]
    draft_probs = None
    if draft_kind == "draft_probs":
        draft_probs = torch.cat([q_rows, torch.zeros(1, VOCAB)]).repeat(N, 1)
    sampler = RejectionSampler(Sampler(seed=1), use_kernel=False)
    out, _ = sampler.sample(rows, _requests(SamplingParams(temperature=temperature, max_tokens=8), N), drafts,
                            draft_probs)
    _check(torch.bincount(out[:, 0], minlength=VOCAB), p[0])
    second = out[:, 1][out[:, 1] >= 0]
    assert second.numel() > N // 10
    _check(torch.bincount(second, minlength=VOCAB), p[1])


def test_greedy_is_argmax_equality():
    logits = _target_logits()
    best = logits.argmax(-1).tolist()
    drafts = [[best[0], best[1]], [best[0], (best[1] + 1) % VOCAB], [(best[0] + 1) % VOCAB, best[1]]]
    out, _ = RejectionSampler(Sampler(), use_kernel=False).sample(
        logits.repeat(3, 1), _requests(SamplingParams(temperature=0.0, max_tokens=8), 3), drafts)
    assert out.tolist() == [best, [best[0], best[1], -1], [best[0], -1, -1]]


def test_seeded_requests_repeat_and_penalties_see_earlier_drafts():
    logits = torch.zeros(3, VOCAB)
    logits[:, 4] = 1.0  # token 4 leads ...
    params = SamplingParams(temperature=0.0, frequency_penalty=2.0, max_tokens=8)
    out, _ = RejectionSampler(Sampler(), use_kernel=False).sample(logits, _requests(params, 1), [[4, 0]])
    # ... until the accepted draft 4 is penalised at the next position: the draft 0 is the new argmax
    assert out.tolist() == [[4, 0, 1]]
    seeded = SamplingParams(temperature=1.0, seed=9, max_tokens=8)
    runs = [RejectionSampler(Sampler(), use_kernel=False).sample(
        _target_logits().repeat(4, 1), _requests(seeded, 4), [[1, 2]] * 4)[0] for _ in range(2)]
    assert torch.equal(runs[0], runs[1])

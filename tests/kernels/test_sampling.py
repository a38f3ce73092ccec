import pytest
import torch

from kernels.sampling import sample_tokens, sample_tokens_ref

# chi-square critical value, 5 degrees of freedom (6 categories), p = 0.001
CHI2_DF5_P001 = 20.52


def _i64(values, device):
    return torch.as_tensor(values, dtype=torch.int64, device=device)


def test_greedy_rows_equal_argmax(device):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 5000, generator=gen).to(device)  # vocab > one 4096 block
    logits[1, 4500] = 50.0  # maximum in the second block
    logits[2, [10, 4100]] = 50.0  # tie across blocks: first index wins, as torch.argmax
    logits[3, [300, 301]] = 50.0  # tie inside a block
    temps = torch.zeros(6, device=device)
    got = sample_tokens(logits, temps, _i64(range(6), device), _i64([3] * 6, device))
    assert torch.equal(got, logits.argmax(-1))
    assert got[2].item() == 10 and got[3].item() == 300


def test_mixed_batch_and_determinism(device):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 300, generator=gen).to(device)
    temps = torch.tensor([0.0, 1.0, 0.7, 0.0, 1.3, 0.5, 0.0, 2.0], device=device)
    seeds, offsets = (
        _i64([11, 12, 13, 14, 15, 16, 17, 18], device),
        _i64([0, 5, 5, 9, 2**40, 1, 0, 7], device),
    )
    first = sample_tokens(logits, temps, seeds, offsets)
    again = sample_tokens(logits, temps, seeds, offsets)
    assert torch.equal(first, again)  # same (seed, offset) -> same token
    greedy = temps == 0
    assert torch.equal(first[greedy], logits[greedy].argmax(-1))
    assert ((first >= 0) & (first < 300)).all()
    # a near-zero temperature samples the argmax
    cold = sample_tokens(logits, torch.full((8,), 1e-4, device=device), seeds, offsets)
    assert torch.equal(cold, logits.argmax(-1))


def test_sampled_distribution_chi_square(device):
    gen = torch.Generator().manual_seed(2)
    # the interpreter costs ~20 ms per row: fewer draws on the CPU, every expected count still >= 20
    num_draws, temperature = (20000 if device == "cuda" else 800), 0.8
    row = torch.tensor([0.3, -0.5, 1.0, 0.0, -0.2, 0.6]) + 0.3 * torch.randn(6, generator=gen)
    logits = row.expand(num_draws, 6).contiguous().to(device)
    temps = torch.full((num_draws,), temperature, device=device)
    seeds = torch.full((num_draws,), 1234, dtype=torch.int64, device=device)
    tokens = sample_tokens(logits, temps, seeds, torch.arange(num_draws, device=device))
    counts = torch.bincount(tokens.cpu(), minlength=6).double()
    expected = torch.softmax(row.double() / temperature, -1) * num_draws
    assert expected.min() >= 20
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < CHI2_DF5_P001, (chi2, counts.tolist(), expected.tolist())
    # the reference sampler draws from the same distribution
    ref = sample_tokens_ref(logits, temps, generator=torch.Generator(device=device).manual_seed(0))
    ref_counts = torch.bincount(ref.cpu(), minlength=6).double()
    assert ((ref_counts - expected) ** 2 / expected).sum().item() < CHI2_DF5_P001


def test_sampling_rejects_bad_inputs(device):
    logits = torch.randn(2, 10, device=device)
    t, s = torch.ones(2, device=device), _i64([1, 2], device)
    with pytest.raises(ValueError, match="logits"):
        sample_tokens(logits.half(), t, s, s)
    with pytest.raises(ValueError, match="seeds"):
        sample_tokens(logits, t, s.int(), s)
    with pytest.raises(ValueError, match="temperatures"):
        sample_tokens(logits, t[:1], s, s)


@pytest.mark.gpu
def test_sampling_real_shapes_cuda_graph():
    logits = torch.randn(256, 151936, device="cuda")
    temps = torch.where(torch.arange(256, device="cuda") % 2 == 0, 0.0, 0.9)
    seeds = torch.arange(256, device="cuda", dtype=torch.int64)
    offsets = torch.zeros(256, device="cuda", dtype=torch.int64)
    out = sample_tokens(logits, temps, seeds, offsets)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sample_tokens(logits, temps, seeds, offsets, out=out)
    out.fill_(-1)
    graph.replay()
    assert torch.equal(out[0::2], logits[0::2].argmax(-1))
    assert torch.equal(out, sample_tokens(logits, temps, seeds, offsets))

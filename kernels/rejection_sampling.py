"""Speculative decoding's accept / reject step (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", https://arxiv.org/abs/2211.17192, algorithm 1; Chen et al. 2023, "Accelerating Large
Language Model Decoding with Speculative Sampling", https://arxiv.org/abs/2302.01318).

For request b with n_b draft tokens d_1..d_n (drawn from the draft distributions q_j), target distributions
p_1..p_{n+1} (p_j conditioned on the tokens before d_j; p_{n+1} after d_n):

    accept d_j while u_j * q_j(d_j) < p_j(d_j), u_j ~ U[0, 1)  (probability min(1, p_j(d_j) / q_j(d_j)));
    at the first rejected j emit r_j ~ norm(max(p_j - q_j, 0)) and stop;
    if all n are accepted emit a bonus token r_{n+1} ~ p_{n+1}.

Every emitted token is then distributed exactly as p (the papers' theorem). A proposer without probabilities
(n-gram, suffix tree) is a one-hot q: q_j(d_j) = 1, so d_j is accepted with probability p_j(d_j), and the
residual is p_j with d_j removed. Greedy rows use one-hot p at the argmax: d_j is accepted iff it is the
argmax, and r_j is the argmax: the output equals greedy decoding without speculation.

The vocabulary-wide work (the residual and bonus draws r_j) is done by the caller (`rejection_sampler.py`);
this kernel is the per-request accept loop, one program per request, over `[batch, k]` padded inputs,
without host synchronisation (so it can be enqueued behind the forward pass).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._checks import check_same_device, check_tensor


def rejection_sample_ref(
    draft_token_ids: torch.Tensor,  # [batch, k] int64; entries j >= num_drafts[b] are ignored
    num_drafts: torch.Tensor,  # [batch] int32, 0 <= n_b <= k
    target_probs: torch.Tensor,  # [batch, k] fp32: p_j(d_j)
    draft_probs: torch.Tensor | None,  # [batch, k] fp32: q_j(d_j); None = one-hot drafts (q_j(d_j) = 1)
    uniforms: torch.Tensor,  # [batch, k] fp32 in [0, 1)
    recovered: torch.Tensor,  # [batch, k + 1] int64: r_j (residual draw at j < n_b, bonus at j = n_b)
) -> torch.Tensor:  # [batch, k + 1] int64: emitted tokens, then -1
    """Pure-torch reference: the accept loop written out per request."""
    batch, k = draft_token_ids.shape
    out = torch.full((batch, k + 1), -1, dtype=torch.int64, device=draft_token_ids.device)
    for b in range(batch):
        n = int(num_drafts[b])
        j = 0
        while j < n:
            q = 1.0 if draft_probs is None else float(draft_probs[b, j])
            if not float(uniforms[b, j]) * q < float(target_probs[b, j]):
                break
            out[b, j] = draft_token_ids[b, j]
            j += 1
        out[b, j] = recovered[b, j]
    return out


@triton.jit
def _rejection_kernel(
    draft_ptr, num_ptr, p_ptr, q_ptr, u_ptr, rec_ptr, out_ptr, k,
    HAS_Q: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_K)
    n = tl.load(num_ptr + b)
    in_draft = j < n
    d = tl.load(draft_ptr + b * k + j, mask=in_draft, other=0)
    p = tl.load(p_ptr + b * k + j, mask=in_draft, other=0.0)
    u = tl.load(u_ptr + b * k + j, mask=in_draft, other=1.0)
    if HAS_Q:
        q = tl.load(q_ptr + b * k + j, mask=in_draft, other=1.0)
    else:
        q = tl.full((BLOCK_K,), 1.0, tl.float32)
    rejected = in_draft & (u * q >= p)
    first_rejected = tl.min(tl.where(rejected, j, n), 0)  # n when all drafts are accepted
    rec = tl.load(rec_ptr + b * (k + 1) + j, mask=j <= k, other=-1)
    out = tl.where(j < first_rejected, d, tl.where(j == first_rejected, rec, -1))
    tl.store(out_ptr + b * (k + 1) + j, out.to(tl.int64), mask=j <= k)


def rejection_sample(
    draft_token_ids: torch.Tensor,  # [batch, k] int64
    num_drafts: torch.Tensor,  # [batch] int32
    target_probs: torch.Tensor,  # [batch, k] fp32
    draft_probs: torch.Tensor | None,  # [batch, k] fp32 or None (one-hot drafts)
    uniforms: torch.Tensor,  # [batch, k] fp32
    recovered: torch.Tensor,  # [batch, k + 1] int64
) -> torch.Tensor:  # [batch, k + 1] int64
    """Triton launcher with `rejection_sample_ref`'s contract. Raises ValueError on bad shapes, dtypes or
    layouts (every input contiguous, on one device)."""
    check_tensor("draft_token_ids", draft_token_ids, 2, (torch.int64,), contiguous=True)
    batch, k = draft_token_ids.shape
    check_tensor("num_drafts", num_drafts, 1, (torch.int32,), contiguous=True)
    check_tensor("target_probs", target_probs, 2, (torch.float32,), contiguous=True)
    check_tensor("uniforms", uniforms, 2, (torch.float32,), contiguous=True)
    check_tensor("recovered", recovered, 2, (torch.int64,), contiguous=True)
    tensors = {"draft_token_ids": draft_token_ids, "num_drafts": num_drafts, "target_probs": target_probs,
               "uniforms": uniforms, "recovered": recovered}
    if draft_probs is not None:
        check_tensor("draft_probs", draft_probs, 2, (torch.float32,), contiguous=True)
        tensors["draft_probs"] = draft_probs
    check_same_device(**tensors)
    expected = {"num_drafts": (batch,), "target_probs": (batch, k), "uniforms": (batch, k),
                "recovered": (batch, k + 1), "draft_probs": (batch, k)}
    for name, t in tensors.items():
        if name in expected and tuple(t.shape) != expected[name]:
            raise ValueError(f"{name} must have shape {expected[name]}, got {tuple(t.shape)}")
    out = torch.empty((batch, k + 1), dtype=torch.int64, device=draft_token_ids.device)
    if batch:
        _rejection_kernel[(batch,)](
            draft_token_ids, num_drafts, target_probs, target_probs if draft_probs is None else draft_probs,
            uniforms, recovered, out, k, HAS_Q=draft_probs is not None, BLOCK_K=triton.next_power_of_2(k + 1),
        )  # fmt: skip
    return out

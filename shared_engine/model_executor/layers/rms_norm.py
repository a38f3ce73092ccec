"""RMSNorm (Zhang & Sennrich 2019, https://arxiv.org/abs/1910.07467), optionally fused with the residual add."""

from __future__ import annotations

import torch
from torch import nn

from kernels.rms_norm import rms_norm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self,
        x: torch.Tensor,  # [num_tokens, hidden]
        residual: torch.Tensor | None = None,  # [num_tokens, hidden]
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Without `residual`: the normalised x. With it: `(norm(x + residual), x + residual)`.

        Computed in fp32 and cast back, as Hugging Face's LlamaRMSNorm does; on CUDA one fused Triton kernel.
        """
        if x.is_cuda and x.dim() == 2:
            return rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = x + residual
            residual = x
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)

"""SwiGLU's gate: SiLU(gate) * up (Shazeer 2020, https://arxiv.org/abs/2002.05202)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.silu_and_mul import silu_and_mul as _silu_and_mul_kernel


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """`x` `[num_tokens, 2 * intermediate]` (gate first, then up) → `[num_tokens, intermediate]`."""
    if x.is_cuda:
        return _silu_and_mul_kernel(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up

"""Rotary position embedding (RoPE, Su et al. 2021, https://arxiv.org/abs/2104.09864), neox layout
(rotate_half, as Hugging Face Llama/Qwen), with Llama 3.1's frequency scaling (the cos/sin table comes from
`kernels.build_cos_sin_cache`). CUDA runs the Triton kernel in place; the CPU runs its torch reference."""

from __future__ import annotations

import torch
from torch import nn

from kernels.rotary_embedding import apply_rotary_embedding, build_cos_sin_cache


class RotaryEmbedding(nn.Module):
    """Holds `cos_sin_cache` `[max_position, head_dim]` (cos in the first half, sin in the second)."""

    def __init__(self, head_dim: int, max_position: int, rope_theta: float, rope_scaling: dict | None) -> None:
        super().__init__()
        cache = build_cos_sin_cache(head_dim, max_position, rope_theta, rope_scaling)
        self.register_buffer("cos_sin_cache", cache, persistent=False)
        self.head_dim = head_dim

    def forward(
        self,
        positions: torch.Tensor,  # [num_tokens] int64
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if q.is_cuda:
            return apply_rotary_embedding(positions, q, k, self.cos_sin_cache)
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)  # [num_tokens, 1, head_dim/2]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)

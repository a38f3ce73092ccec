"""Pure-PyTorch paged attention: the CPU path and the reference the Triton backend is tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shared_engine.model_executor.attention.metadata import AttentionMetadata
from shared_engine.model_executor.attention.registry import register_backend


@register_backend("torch")
class TorchPagedAttention:
    """Writes the step's K/V into their slots, then attends over each sequence's cached context.

    Decodes are batched: their contexts are gathered through the block table into one padded tensor.
    Prefill chunks run one sequence at a time with a causal mask offset by the cached prefix.
    """

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = _decode(q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.context_lens_list[:nd], scale)
        offsets = meta.cu_seqlens_q.tolist() if meta.num_seqs > nd else []
        for b in range(nd, meta.num_seqs):
            start, end = offsets[b], offsets[b + 1]
            ctx = meta.context_lens_list[b]
            keys, values = _gather(k_cache, v_cache, meta.block_tables[b], ctx)
            out[start:end] = _attend(q[start:end], keys, values, ctx, scale)
        return out


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Store each new token's K/V at its flat slot (block * block_size + offset); slots < 0 are skipped."""
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    flat_v = v_cache.view(-1, *v_cache.shape[2:])
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    flat_k.index_copy_(0, slot_mapping, k)
    flat_v.index_copy_(0, slot_mapping, v)


def _gather(k_cache, v_cache, block_table, ctx: int):
    block_size = k_cache.shape[1]
    blocks = block_table[: -(-ctx // block_size)].long()
    keys = k_cache.index_select(0, blocks).flatten(0, 1)[:ctx]  # [ctx, num_kv_heads, head_dim]
    values = v_cache.index_select(0, blocks).flatten(0, 1)[:ctx]
    return keys, values


def _attend(q, keys, values, ctx: int, scale: float) -> torch.Tensor:
    n = q.shape[0]
    mask = None
    if n > 1:
        q_pos = torch.arange(ctx - n, ctx, device=q.device)[:, None]
        mask = torch.arange(ctx, device=q.device)[None, :] <= q_pos  # [n, ctx]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), keys.transpose(0, 1), values.transpose(0, 1), attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.transpose(0, 1)


def _decode(q, k_cache, v_cache, block_tables, context_lens: list[int], scale: float) -> torch.Tensor:
    block_size = k_cache.shape[1]
    max_ctx = max(context_lens)
    nblocks = -(-max_ctx // block_size)
    idx = block_tables[:, :nblocks].long().flatten()  # [B * nblocks]
    B = q.shape[0]
    # index_select copies whole blocks (contiguous rows): ~3x faster on the CPU than advanced indexing
    keys = k_cache.index_select(0, idx).view(B, nblocks * block_size, *k_cache.shape[2:])  # [B, L, Hkv, D]
    values = v_cache.index_select(0, idx).view(B, nblocks * block_size, *v_cache.shape[2:])
    lens = torch.tensor(context_lens, device=q.device)
    mask = torch.arange(nblocks * block_size, device=q.device)[None, :] < lens[:, None]  # [B, L]
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),  # [B, num_heads, 1, head_dim]
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=mask[:, None, None, :],
        scale=scale,
        enable_gqa=True,
    )
    return out.squeeze(2)

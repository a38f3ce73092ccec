"""Pure-PyTorch paged attention: the CPU path and the reference the Triton backend is tested against."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels.fp8 import FP8_DTYPE, quantize_fp8_ref
from shared_engine.model_executor.attention.metadata import AttentionMetadata
from shared_engine.model_executor.attention.registry import register_backend


@register_backend("torch")
class TorchPagedAttention:
    """Writes the step's K/V into their slots, then attends over each sequence's cached context.

    Decodes are batched in buckets of similar context length: each bucket's contexts are gathered through
    the block table into one padded tensor.
    Prefill chunks run one sequence at a time with a causal mask offset by the cached prefix.
    An FP8 cache (float8_e4m3fn) stores `fp8(clamp(x / scale))` (kernels/fp8.py) and is read cast to q's
    dtype, `k_scale` folded into the softmax scale and `v_scale` applied to the output (both exact).
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
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        if k_cache.dtype == FP8_DTYPE:
            scale *= k_scale
        else:
            v_scale = 1.0
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            block_tables, context_lens = meta.block_tables[:nd], meta.context_lens_list[:nd]
            plan = meta.backend_cache.get("torch_decode")
            if plan is None:  # once per step, shared by every layer
                plan = meta.backend_cache["torch_decode"] = _decode_plan(block_tables, context_lens, k_cache.shape[1])
            out[:nd] = _decode(q[:nd], k_cache, v_cache, block_tables, context_lens, scale, plan)
        offsets = meta.cu_seqlens_q.tolist() if meta.num_seqs > nd else []
        for b in range(nd, meta.num_seqs):
            start, end = offsets[b], offsets[b + 1]
            ctx = meta.context_lens_list[b]
            keys, values = _gather(k_cache, v_cache, meta.block_tables[b], ctx, q.dtype)
            out[start:end] = _attend(q[start:end], keys, values, ctx, scale)
        if v_scale != 1.0:
            out.mul_(v_scale)
        return out


def write_kv(k, v, k_cache, v_cache, slot_mapping, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Store each new token's K/V at its flat slot (block * block_size + offset); slots < 0 are skipped. An
    FP8 cache gets `quantize_fp8_ref(x, scale)`, through uint8 views (the CPU has no fp8 index_copy_)."""
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        k, v, slot_mapping = k[keep], v[keep], slot_mapping[keep]
    if k_cache.dtype == FP8_DTYPE:
        k, v = quantize_fp8_ref(k, k_scale).view(torch.uint8), quantize_fp8_ref(v, v_scale).view(torch.uint8)
        k_cache, v_cache = k_cache.view(torch.uint8), v_cache.view(torch.uint8)
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


def _gather(k_cache, v_cache, block_table, ctx: int, dtype: torch.dtype):
    """One sequence's first `ctx` tokens of K and V `[ctx, num_kv_heads, head_dim]`, in `dtype` (an FP8 cache:
    its stored values, unscaled)."""
    block_size = k_cache.shape[1]
    blocks = block_table[: -(-ctx // block_size)].long()
    keys = _select_blocks(k_cache, blocks).flatten(0, 1)[:ctx].to(dtype)
    values = _select_blocks(v_cache, blocks).flatten(0, 1)[:ctx].to(dtype)
    return keys, values


def _select_blocks(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """`cache.index_select(0, blocks)`; an FP8 cache through a uint8 view (not every device's index_select
    takes float8)."""
    if cache.dtype != FP8_DTYPE:
        return cache.index_select(0, blocks)
    return cache.view(torch.uint8).index_select(0, blocks).view(FP8_DTYPE)


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


# Decodes whose context lengths are within this factor of each other share one padded gather.
_BUCKET_SPREAD = 1.1


@dataclass(frozen=True)
class _DecodeBucket:
    """Decode sequences of similar context length, attended together over one padded gather."""

    seqs: torch.Tensor  # [b] int64: positions of the bucket's sequences among the step's decodes
    blocks: torch.Tensor  # [b * num_blocks] int64: their block ids, row-major, padded with their own blocks
    num_blocks: int
    max_len: int  # longest context in the bucket, in tokens
    mask: torch.Tensor | None  # [b, 1, 1, max_len] bool: key position < context length; None if all equal


def _decode_plan(block_tables: torch.Tensor, context_lens: list[int], block_size: int) -> list[_DecodeBucket]:
    """Sort decodes by context length and cut them into buckets whose longest is <= 1.1x their shortest.

    Padding every decode to the batch's longest context (the plain approach) reads and copies about twice
    the KV that uniform-length batches need; on the CPU decode attention is memory-bound, so bucketing cuts
    its time about 5x at batch 48 with contexts in [48, 768] (measured with SmolLM2-135M's head layout).
    """
    order = sorted(range(len(context_lens)), key=context_lens.__getitem__)
    buckets = []
    i = 0
    while i < len(order):
        j = i + 1
        while j < len(order) and context_lens[order[j]] <= context_lens[order[i]] * _BUCKET_SPREAD:
            j += 1
        seqs = torch.tensor(order[i:j], device=block_tables.device)
        lens = [context_lens[k] for k in order[i:j]]
        max_len = max(lens)
        num_blocks = -(-max_len // block_size)
        mask = None
        if min(lens) != max_len:
            positions = torch.arange(max_len, device=block_tables.device)
            mask = (positions[None, :] < torch.tensor(lens, device=block_tables.device)[:, None])[:, None, None, :]
        blocks = block_tables.index_select(0, seqs)[:, :num_blocks].long().flatten()
        buckets.append(_DecodeBucket(seqs, blocks, num_blocks, max_len, mask))
        i = j
    return buckets


def _decode(q, k_cache, v_cache, block_tables, context_lens: list[int], scale: float, plan=None) -> torch.Tensor:
    """Single-query attention for each decode over its cached context.

    q: [B, num_heads, head_dim]; caches [num_blocks, block_size, num_kv_heads, head_dim]; returns q's shape.
    The query heads that share a KV head are treated as that head's queries ([B, Hkv, group, D]), so K/V
    are never repeated for grouped-query attention.
    """
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    if plan is None:
        plan = _decode_plan(block_tables, context_lens, block_size)
    out = torch.empty_like(q)
    group = q.shape[1] // num_kv_heads
    for bucket in plan:
        b = bucket.seqs.numel()
        # index_select copies whole blocks (contiguous rows): ~3x faster on the CPU than advanced indexing
        keys = _select_blocks(k_cache, bucket.blocks).view(b, -1, num_kv_heads, head_dim)[:, : bucket.max_len]
        values = _select_blocks(v_cache, bucket.blocks).view(b, -1, num_kv_heads, head_dim)[:, : bucket.max_len]
        keys, values = keys.to(q.dtype), values.to(q.dtype)  # an FP8 cache: exact; the scales are the caller's
        bucket_out = F.scaled_dot_product_attention(
            q.index_select(0, bucket.seqs).view(b, num_kv_heads, group, head_dim),
            keys.transpose(1, 2),  # [b, Hkv, L, D]
            values.transpose(1, 2),
            attn_mask=bucket.mask,
            scale=scale,
        )
        out.index_copy_(0, bucket.seqs, bucket_out.reshape(b, -1, head_dim))
    return out

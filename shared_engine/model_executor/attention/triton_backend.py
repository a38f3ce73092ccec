"""Triton paged attention (CUDA): KV write, then split-K decode attention for the leading decode sequences
(cascade attention over their shared block-table prefix when the metadata carries one) and varlen causal
prefill attention for the prefill chunks after them. No host syncs, so a step can be captured in a CUDA
graph. An FP8 cache (float8_e4m3fn) is written and read with the layer's `k_scale` / `v_scale`."""

from __future__ import annotations

import torch

from kernels.kv_cache_write import write_kv_cache
from kernels.paged_decode_attention import paged_decode_attention
from kernels.paged_prefill_attention import paged_prefill_attention
from kernels.ragged_prefill_attention import ragged_layout_ok, ragged_prefill_attention
from kernels.shared_prefix_decode_attention import shared_prefix_decode_attention
from shared_engine.model_executor.attention.metadata import AttentionMetadata
from shared_engine.model_executor.attention.registry import register_backend

# Prefill chunks may read their own K/V from the step's k / v (kernels/ragged_prefill_attention.py, TMA) instead of
# back from the paged cache: faster than the paged kernel in all four cells of the first sweep (H100, sm_90 as the
# H200, dc8ddbd, benchmarks/results/prefill_attention_h100_dc8ddbd.json, launcher defaults, us): 4 x 2,048 new tokens
# bf16 353 vs 445, FP8 cache 458 vs 578; the RAG chunk bf16 124 vs 125, FP8 153 vs 164; kernel and backend tests
# passed on that GPU. On since c6876ad's GPU run: tests/engine/test_ragged_prefill_graphs.py (the kernel inside
# captured CUDA graphs, generations vs the paged kernel; fp32, like the other graph tests) and the kernel's bf16
# tests at llama-8b shapes passed on an H100 (benchmarks/results/fp8_kernel_tests_h100_c6876ad.log); the sweep at
# c6876ad (same card): 4 x 2,048 bf16 359 vs the paged kernel's 439 us. Used only where the cache holds k / v
# exactly (cache dtype = k's). Its tiles follow the chunk, so where a prompt's chunks split moves its results at
# rounding level (the paged kernel tiles absolute positions: split-invariant); over an FP8 cache an unquantised
# chunk would move them at quantisation level (handed.md K6), so FP8 caches stay on the paged kernel.
RAGGED_PREFILL = True


@register_backend("triton")
class TritonPagedAttention:
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
        write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping, k_scale, v_scale)
        scales = dict(k_scale=k_scale, v_scale=v_scale)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd and meta.use_cascade:
            shared_prefix_decode_attention(q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.context_lens[:nd],
                                           meta.prefix_blocks, meta.prefix_len, scale, out=out[:nd],
                                           max_prefix_len=meta.max_prefix_len, max_context_len=meta.max_context_len,
                                           **scales)
        elif nd:
            paged_decode_attention(q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.context_lens[:nd], scale,
                                   out=out[:nd], max_context_len=meta.max_context_len, **scales)
        if meta.num_seqs > nd:
            cu = meta.cu_seqlens_q[nd:] - nd  # prefill tokens start right after the nd decode tokens
            args = (k_cache, v_cache, meta.block_tables[nd:], cu, meta.context_lens[nd:], scale)
            exact = k_cache.dtype == k.dtype  # the cache holds the chunk's k / v bit for bit
            if RAGGED_PREFILL and exact and ragged_layout_ok(k[nd:]) and ragged_layout_ok(v[nd:]):
                ragged_prefill_attention(q[nd:], k[nd:], v[nd:], *args, max_seqlen_q=meta.max_query_len,
                                         out=out[nd:], **scales)
            else:
                paged_prefill_attention(q[nd:], *args, max_seqlen_q=meta.max_query_len, out=out[nd:], **scales)
        return out

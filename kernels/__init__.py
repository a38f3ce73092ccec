"""Triton kernels of the engine, each with a pure-torch reference (`*_ref`) the CPU path may call.

Imports nothing from the engine.
"""

from kernels.kv_cache_write import write_kv_cache, write_kv_cache_ref
from kernels.paged_decode_attention import (
    choose_num_splits,
    paged_decode_attention,
    paged_decode_attention_ref,
)
from kernels.paged_prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from kernels.rms_norm import rms_norm, rms_norm_ref
from kernels.rotary_embedding import apply_rotary_embedding, apply_rotary_embedding_ref, build_cos_sin_cache
from kernels.sampling import sample_tokens, sample_tokens_ref
from kernels.silu_and_mul import silu_and_mul, silu_and_mul_ref

__all__ = [
    "apply_rotary_embedding",
    "apply_rotary_embedding_ref",
    "build_cos_sin_cache",
    "choose_num_splits",
    "paged_decode_attention",
    "paged_decode_attention_ref",
    "paged_prefill_attention",
    "paged_prefill_attention_ref",
    "rms_norm",
    "rms_norm_ref",
    "sample_tokens",
    "sample_tokens_ref",
    "silu_and_mul",
    "silu_and_mul_ref",
    "write_kv_cache",
    "write_kv_cache_ref",
]

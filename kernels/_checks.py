"""Argument checks shared by the kernel launchers (each raises ValueError with a clear message)."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_tensor(
    name: str,
    t: torch.Tensor,
    ndim: int,
    dtypes: tuple[torch.dtype, ...],
    contiguous: bool = False,
    last_dim_contiguous: bool = True,
) -> None:
    """Check rank, dtype and layout of one launcher argument."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")
    if last_dim_contiguous and t.numel() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have stride 1 in its last dim, got strides {t.stride()}")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name} must have shape {tuple(expected)}, got {tuple(t.shape)}")


def is_power_of_two(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


_NUM_SMS: dict[str, int] = {}


def device_num_sms(device: torch.device) -> int:
    """Multiprocessor count of a CUDA device (cached: no query per call); 132 (H100/H200) elsewhere."""
    if device.type != "cuda":
        return 132
    key = str(device)
    if key not in _NUM_SMS:
        _NUM_SMS[key] = torch.cuda.get_device_properties(device).multi_processor_count
    return _NUM_SMS[key]


def check_paged_attention_args(
    q: torch.Tensor,  # [num_tokens_or_seqs, num_q_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq]
    num_seqs: int,
) -> tuple[int, int]:
    """Shared checks of the paged attention launchers; returns (block_size, num_kv_heads).

    The caches hold q's dtype, or both float8_e4m3fn (an FP8 KV cache, read with per-tensor scales).
    Raises ValueError on mismatched cache shapes or dtypes, a GQA ratio that is not an integer, or a
    head_dim / block_size that is not a power of two (head_dim >= 16)."""
    _, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    check_shape("k_cache", k_cache, (num_blocks, block_size, num_kv_heads, head_dim))
    check_shape("v_cache", v_cache, tuple(k_cache.shape))
    if block_tables.shape[0] != num_seqs:
        raise ValueError(f"block_tables must have {num_seqs} rows, got shape {tuple(block_tables.shape)}")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (q.dtype, torch.float8_e4m3fn):
        raise ValueError(f"q, k_cache, v_cache dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype} (the "
                         f"caches hold q's dtype, or both float8_e4m3fn: an FP8 KV cache)")
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    if head_dim < 16 or not is_power_of_two(head_dim):
        raise ValueError(f"head_dim must be a power of two >= 16, got {head_dim}")
    if not is_power_of_two(block_size):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    return block_size, num_kv_heads

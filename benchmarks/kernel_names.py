"""How the profiling scripts group CUDA kernels: one key per kind of kernel (torch.profiler event names)."""

from __future__ import annotations

_MATMUL_MARKERS = ("gemm", "gemv", "sm90", "cutlass", "nvjet")  # cuBLAS / cuBLASLt / CUTLASS kernel names


def kernel_key(name: str) -> str:
    """"gemm" for every cuBLAS/CUTLASS matmul, else the kernel's name up to its argument list (60 chars)."""
    if any(marker in name.lower() for marker in _MATMUL_MARKERS):
        return "gemm"
    return name.split("(")[0][:60]

"""`serving_jit`: `triton.jit` for kernels whose integer arguments and pointer offsets change from step to step.

Triton compiles one variant per "specialisation" of the integer arguments (== 1, divisible by 16) and of
the pointers (16-byte aligned or not). A serving step hands the attention kernels slices such as
`block_tables[num_decodes:]` and a block-table width that vary with the batch, so a new combination could
compile a new variant in the middle of serving, a stall of about a second (seen as multi-second TTFTs at
the start of the H200 runs). Naming those arguments here keeps one variant per kernel.
"""

from __future__ import annotations

import inspect

import triton

_JIT_PARAMS = set(inspect.signature(triton.jit).parameters)


def serving_jit(*, ints: tuple[str, ...] = (), pointers: tuple[str, ...] = ()):
    """`triton.jit` that does not specialise `ints` on their value nor `pointers` on their alignment
    (the latter where this Triton supports it)."""
    kwargs = {"do_not_specialize": list(ints)}
    if pointers and "do_not_specialize_on_alignment" in _JIT_PARAMS:
        kwargs["do_not_specialize_on_alignment"] = list(pointers)
    return triton.jit(**kwargs)

"""The ragged prefill kernel (kernels/ragged_prefill_attention.py: the chunk's K/V from the step's k / v through
TMA, the cached prefix from the paged cache) timed on bench_prefill_attention.py's cases, in the same process as
SDPA and the paged kernel: its defaults and (sweep) its TILE_CONFIGS, with and without reversed tiles. k / v are
strided views of one fused qkv buffer, as the model's projection hands them to the attention backend."""

from __future__ import annotations

import torch
from kernel_bench_common import BF16, DEV, bench_us, rel_err

from kernels.paged_decode_attention import gather_paged_kv
from kernels.ragged_prefill_attention import (
    OCCUPANCY_TILES,
    TILE_CONFIGS,
    WARP_SPECIALIZED_TILES,
    launch_defaults,
    ragged_prefill_attention,
    ragged_prefill_attention_ref,
)

MAX_REL_ERR = 2e-2  # "fastest" only among configs this close to the reference (bf16 rows: ~2e-3)


def chunk_kv(q, k_cache, v_cache, bt, q_lens: list[int], ctx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk rows of every sequence (bf16), as k / v views into a [tokens, (hq + 2 hk) * d] buffer."""
    hq, hk, d = q.shape[1], k_cache.shape[2], q.shape[2]
    rows = lambda c: torch.cat([gather_paged_kv(c, bt[b], n)[n - ql:] for b, (ql, n) in enumerate(zip(q_lens, ctx))])
    qkv = torch.empty(q.shape[0], (hq + 2 * hk) * d, device=DEV, dtype=BF16)
    _, k, v = qkv.split([hq * d, hk * d, hk * d], dim=1)
    k.copy_(rows(k_cache).flatten(1))
    v.copy_(rows(v_cache).flatten(1))
    return k.view(-1, hk, d), v.view(-1, hk, d)


def ragged_rows(q, k, v, kc, vc, bt, cu, lens, scale: float, max_q: int, scales: dict, flops: float, t_sdpa: float,
                sweep: bool) -> dict:
    """{"default": ..., "sweep": [...], "fastest": ...}: us, TFLOP/s, % of SDPA's speed, relative error against
    ragged_prefill_attention_ref (fp32; over an FP8 cache the prefix dequantised, the chunk from k / v)."""
    ref = ragged_prefill_attention_ref(q, k, v, kc, vc, bt, cu, lens, scale, **scales)
    out = torch.empty_like(q)

    def timed(**kw) -> dict:
        fn = lambda: ragged_prefill_attention(q, k, v, kc, vc, bt, cu, lens, scale, max_q, out=out, **scales, **kw)
        try:
            fn()
            t = bench_us(fn)
        except Exception as e:  # e.g. out of shared memory, or a TMA form this Triton cannot build: record it
            return {**kw, "error": str(e)[:300]}
        return {**kw, "us": t, "TFLOPs": flops / t / 1e6, "pct_of_sdpa_speed": 100 * t_sdpa / t,
                "rel_err": rel_err(out, ref)}

    r = {"default": {**launch_defaults(kc.dtype, max_q), **timed()}}
    if sweep:
        r["sweep"] = [timed(block_m=bm, block_n=bn, num_warps=w, num_stages=st, reverse_tiles=rev)
                      for bm, bn, w, st in TILE_CONFIGS for rev in (True, False)]
        # Triton's warp specialisation of the chunk loop
        r["sweep"] += [timed(block_m=bm, block_n=bn, num_warps=w, num_stages=st, reverse_tiles=True,
                             warp_specialize=True) for bm, bn, w, st in WARP_SPECIALIZED_TILES]
        # more programs an SM: fewer stages, a register cap
        r["sweep"] += [timed(block_m=bm, block_n=bn, num_warps=w, num_stages=st, reverse_tiles=True, maxnreg=reg)
                       for bm, bn, w, st, reg in OCCUPANCY_TILES]
    ok = [x for x in [r["default"], *r.get("sweep", [])] if "us" in x and x["rel_err"] < MAX_REL_ERR]
    r["fastest"] = min(ok, key=lambda x: x["us"]) if ok else None
    return r


def ragged_summary(shape: str, r: dict) -> str:
    d, f = r["default"], r.get("fastest") or {}
    if "us" not in d:
        return f"{shape}: ragged default failed: {d.get('error')}"
    cfg = {k: f[k] for k in ("block_m", "block_n", "num_warps", "num_stages", "reverse_tiles", "warp_specialize",
                             "maxnreg")
           if k in f}
    return (f"{shape}: ragged default {d['us']:.0f} us = {d['pct_of_sdpa_speed']:.1f}% of sdpa | fastest "
            f"{f.get('us', float('nan')):.0f} us = {f.get('pct_of_sdpa_speed', float('nan')):.1f}% {cfg} | rel err "
            f"{d['rel_err']:.1e} | >= 90%: default {'yes' if d['pct_of_sdpa_speed'] >= 90 else 'NO'}, fastest "
            f"{'yes' if f.get('pct_of_sdpa_speed', 0) >= 90 else 'NO'}")

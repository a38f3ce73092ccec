"""Prefill attention benchmarks: `paged_prefill_attention` (and, with `sweep`, its tile shapes) against SDPA on
contiguous bf16 K/V, in SDPA-equivalent FLOPs, for 4 x 2048 new tokens and a RAG chunk (450 tokens after a
5,200-token cached prefix), over a bf16 or an FP8 (e4m3, per-tensor scales) paged cache. Imported by
scripts/bench_kernels.py; run alone it is issue 23's must-show (bf16 and FP8 KV, both shapes, SDPA in the same
run, the Hopper tile sweep):

    python scripts/bench_prefill_attention.py --out prefill_h200.json [--sweep] [--commit SHA]

Each row times the launcher's defaults ("default") and aab412d's ("baseline") in the same process; the sweep
adds the tile configs, the loop options and NEW_VARIANTS / FP8_VARIANTS. With the sweep: 73 s for
gpu_fp8_check.sh STEPS=7 at aab412d (84 timed variants, cold Triton cache); now ~114 variants, estimated
~120 s."""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
try:  # the ragged kernel needs triton.tools.tensor_descriptor (host TMA descriptors); without it, no ragged rows
    from bench_ragged_prefill import chunk_kv, ragged_rows, ragged_summary
except ImportError as e:
    chunk_kv = ragged_rows = None
    RAGGED_IMPORT_ERROR = str(e)
from kernel_bench_common import BF16, DEV, bench_us, contiguous_kv, paged_setup, rel_err  # noqa: E402

from benchmarks.env_info import git_commit  # noqa: E402
from kernels import paged_prefill_attention  # noqa: E402
from kernels.fp8 import FP8_MAX, dequantize_fp8_ref, quantize_fp8_ref  # noqa: E402
from kernels.paged_prefill_attention import BASELINE, DEFAULTS, FP8_DEFAULTS, TILE_CONFIGS  # noqa: E402

PREFILL_CONFIGS = TILE_CONFIGS  # (block_m, block_n, num_warps, num_stages), the aab412d default first
PREFETCH_TILES = ((64, 64, 4, 3), (128, 64, 8, 3))  # prefetch also timed at these (deeper pipelines)
# Loop options off: the aab412d kernel (the tile sweep and its options run with these; FP8 rows with fp8_f16 on)
OFF = dict(reverse_tiles=False, prefetch=False, lazy_rescale=False, fp8_f16=False, maxnreg=None)
# The options new since aab412d, on tiles chosen from offline sm_90 compiles (registers, shared memory; see the
# kernel's docstring): maxnreg 168 with 1-2 stages (3 programs an SM), lazy rescaling; FP8 adds the old dtype path.
NEW_VARIANTS = (
    dict(block_m=64, block_n=64, num_warps=4, num_stages=1, maxnreg=168),
    dict(block_m=64, block_n=64, num_warps=4, num_stages=1, maxnreg=168, prefetch=True),
    dict(block_m=64, block_n=64, num_warps=4, num_stages=2, maxnreg=168, prefetch=True),
    dict(block_m=64, block_n=64, num_warps=4, num_stages=3, prefetch=True, lazy_rescale=True),
    dict(block_m=64, block_n=64, num_warps=4, num_stages=2, prefetch=True, lazy_rescale=True),
)
FP8_VARIANTS = (  # FP8 rows only: fp8_f16 off at the fastest FP8 config of aab412d, on at two more
    dict(block_m=64, block_n=64, num_warps=4, num_stages=2, prefetch=True, fp8_f16=False),
    dict(block_m=64, block_n=64, num_warps=4, num_stages=3, prefetch=True),
    dict(block_m=128, block_n=128, num_warps=8, num_stages=2, prefetch=True),
)
CFG_KEYS = ("block_m", "block_n", "num_warps", "num_stages", "reverse_tiles", "prefetch", "lazy_rescale", "fp8_f16",
            "maxnreg")


def fp8_cache(cache: torch.Tensor) -> tuple[torch.Tensor, float, torch.Tensor]:
    """A bf16 cache as FP8 with a per-tensor scale (amax / 448): (cache8, scale, its bf16 dequantisation)."""
    scale = float(cache.float().abs().amax()) / FP8_MAX
    q = quantize_fp8_ref(cache, scale)
    return q, scale, dequantize_fp8_ref(q, scale, BF16)


def prefill_sdpa(q, k_cache, v_cache, bt, q_lens: list[int], ctx_lens: list[int], scale: float) -> dict:
    """SDPA on contiguous K/V, causal with each chunk aligned to the end of its KV; one batched call when the
    sequences share a shape, else one call per sequence. Returns {form: closure} for two forms: enable_gqa
    (K/V at num_kv_heads) and K/V repeated to num_q_heads (some torch builds route lower-right causal with
    GQA away from flash attention); the bench keeps the faster, the first is the accuracy reference."""
    from torch.nn.attention.bias import causal_lower_right

    hq, group = q.shape[1], q.shape[1] // k_cache.shape[2]
    if len(set(zip(q_lens, ctx_lens))) == 1:
        parts = [(0, len(q_lens), q_lens[0], ctx_lens[0])]  # (first seq, seq count, q_len, ctx)
    else:
        parts = [(b, 1, ql, n) for b, (ql, n) in enumerate(zip(q_lens, ctx_lens))]
    calls = []
    for b, nseq, ql, n in parts:
        k = contiguous_kv(k_cache, bt[b : b + nseq])[:, :, :n].contiguous()  # [nseq, num_kv_heads, n, head_dim]
        v = contiguous_kv(v_cache, bt[b : b + nseq])[:, :, :n].contiguous()
        q0 = sum(q_lens[:b])
        q4 = q[q0 : q0 + nseq * ql].view(nseq, ql, hq, -1).transpose(1, 2)  # [nseq, num_q_heads, q_len, head_dim]
        kw = dict(attn_mask=causal_lower_right(ql, n)) if ql < n else dict(is_causal=True)
        calls.append((q4, k, v, kw))
    rep = [(q4, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), kw) for q4, k, v, kw in calls]

    def form(cs, gqa: bool):
        sdpa = F.scaled_dot_product_attention
        return lambda: [sdpa(q4, k, v, scale=scale, enable_gqa=gqa, **kw) for q4, k, v, kw in cs]

    return {"kv_repeated": form(rep, False), "enable_gqa": form(calls, True)}


def sdpa_out(outs: list[torch.Tensor]) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim]
    return torch.cat([o.transpose(1, 2).reshape(-1, o.shape[1], o.shape[3]) for o in outs])


def bench_prefill_case(
    q_lens: list[int], prefixes: list[int], matmul_tflops: float, sweep: bool, gen, hq=32, hk=8, d=128, bs=16,
    kv_dtypes: tuple[str, ...] = ("bf16",), ragged_sweep: bool | None = None,
) -> dict:
    """paged_prefill_attention against SDPA on one varlen batch, over a bf16 cache and (kv_dtypes with "fp8")
    the same values in FP8; SDPA (bf16, contiguous K/V) is timed once, in the same run. The FP8 accuracy
    reference is SDPA over the dequantised cache (the kernel's error, not the quantisation's).

    FLOPs are SDPA-equivalent: 4 * d * heads * sum_b (q_b * prefix_b + q_b^2 / 2) (QK^T and PV over the prefix
    and the causal half of the chunk); with no prefix it is the count of earlier results files.
    Returns the bf16 results at the top level (the keys of earlier results files) and the FP8 ones under "fp8"."""
    ctx = [ql + p for ql, p in zip(q_lens, prefixes)]
    nb = max(-(-n // bs) for n in ctx)
    k_cache, v_cache, bt = paged_setup(len(ctx), nb * bs, hk, d, bs, gen)
    lens = torch.tensor(ctx, dtype=torch.int32, device=DEV)
    cu = torch.tensor([0, *itertools.accumulate(q_lens)], dtype=torch.int32, device=DEV)
    q = torch.randn(sum(q_lens), hq, d, device=DEV, dtype=BF16)
    max_q, scale = max(q_lens), d**-0.5
    sdpa_forms, ref = {}, None
    for name, fn in prefill_sdpa(q, k_cache, v_cache, bt, q_lens, ctx, scale).items():
        try:
            o = sdpa_out(fn())
            ref = o if ref is None else ref
            sdpa_forms[name] = {"us": bench_us(fn), "rel_err": rel_err(o, ref)}
        except Exception as e:  # record the form that cannot run and go on
            sdpa_forms[name] = {"error": str(e)[:200]}
    timed_forms = {name: r["us"] for name, r in sdpa_forms.items() if "us" in r}
    sdpa_form = min(timed_forms, key=timed_forms.get)  # kv_repeated is plain MHA SDPA: it always runs
    t_sdpa = timed_forms[sdpa_form]
    flops = 4 * d * hq * sum(ql * p + ql * ql / 2 for ql, p in zip(q_lens, prefixes))
    out = torch.empty_like(q)
    if chunk_kv is not None:
        k_new, v_new = chunk_kv(q, k_cache, v_cache, bt, q_lens, ctx)  # the ragged kernel's chunk, always bf16

    def timed(kc, vc, reference, scales, **kw) -> dict:
        fn = lambda: paged_prefill_attention(q, kc, vc, bt, cu, lens, scale, max_q, out=out, **scales, **kw)
        try:
            fn()
            t = bench_us(fn)
        except Exception as e:  # e.g. out of shared memory: record and go on
            return {**kw, "error": str(e)[:200]}
        return {**kw, "us": t, "TFLOPs": flops / t / 1e6, "pct_of_sdpa_speed": 100 * t_sdpa / t,
                "rel_err": rel_err(out, reference)}

    def run(kc, vc, reference, scales, tag: str) -> dict:
        fp8 = kc.dtype == torch.float8_e4m3fn
        defaults = FP8_DEFAULTS if fp8 else DEFAULTS
        r = {"shape": f"q_lens {q_lens} after prefixes {prefixes}, {hq}/{hk} heads, d{d}, bs{bs}, {tag} KV",
             "default": {**defaults, **timed(kc, vc, reference, scales)},  # the launcher's defaults (this commit)
             "baseline": timed(kc, vc, reference, scales, **BASELINE)}  # the aab412d defaults, same process
        if "us" in r["default"]:
            r["default"]["pct_matmul_peak"] = 100 * r["default"]["TFLOPs"] / matmul_tflops
        if sweep:
            off = dict(OFF, fp8_f16=fp8)  # the tile sweep: aab412d's loop, FP8 rows on the fp16 dots
            variants = [timed(kc, vc, reference, scales, **off, block_m=bm, block_n=bn, num_warps=w, num_stages=st)
                        for bm, bn, w, st in PREFILL_CONFIGS]
            ok = [x for x in variants if "us" in x]
            tiles = [PREFILL_CONFIGS[0]]  # the loop options on the default and the best config
            if ok:
                best = min(ok, key=lambda x: x["us"])
                tiles.append(tuple(best[k] for k in ("block_m", "block_n", "num_warps", "num_stages")))
            options = [(t, dict(reverse_tiles=True)) for t in dict.fromkeys(tiles)]
            options += [(t, dict(prefetch=True)) for t in dict.fromkeys([*tiles, *PREFETCH_TILES])]
            options += [(t, dict(prefetch=True, reverse_tiles=True)) for t in dict.fromkeys(tiles)]
            variants += [timed(kc, vc, reference, scales, **{**off, **o}, block_m=bm, block_n=bn, num_warps=w,
                               num_stages=st) for (bm, bn, w, st), o in options]
            variants += [timed(kc, vc, reference, scales, **{**off, **v})
                         for v in (*NEW_VARIANTS, *(FP8_VARIANTS if fp8 else ()))]
            ok = [x for x in variants if "us" in x]
            r["default_sweep"] = variants
            r["default_sweep_best"] = min(ok, key=lambda x: x["us"]) if ok else None
        if ragged_rows is None:
            r["ragged"] = {"default": {"error": RAGGED_IMPORT_ERROR}}
        else:
            r["ragged"] = ragged_rows(q, k_new, v_new, kc, vc, bt, cu, lens, scale, max_q, scales, flops, t_sdpa,
                                      sweep if ragged_sweep is None else ragged_sweep)
        return r

    res = {
        "flops": flops,
        "sdpa_us": t_sdpa,
        "sdpa_TFLOPs": flops / t_sdpa / 1e6,
        "sdpa_form": sdpa_form,
        "sdpa_forms": sdpa_forms,
        **run(k_cache, v_cache, ref, {}, "bf16"),
    }
    if "fp8" in kv_dtypes:
        k8, k_scale, k_deq = fp8_cache(k_cache)
        v8, v_scale, v_deq = fp8_cache(v_cache)
        ref8 = sdpa_out(prefill_sdpa(q, k_deq, v_deq, bt, q_lens, ctx, scale)[sdpa_form]())
        res["fp8"] = {"k_scale": k_scale, "v_scale": v_scale, "rel_err_deq_vs_bf16_sdpa": rel_err(ref8, ref),
                      **run(k8, v8, ref8, dict(k_scale=k_scale, v_scale=v_scale), "fp8 (e4m3)")}
    return res


def bench_prefill(matmul_tflops: float, sweep: bool, gen, qlen: int = 2048, kv_dtypes=("bf16",),
                  ragged_sweep: bool | None = None, rag_chunk: bool = True) -> dict:
    """4 x 2048-token prefills (keys as in earlier results files: ours_* is the default layout) and a RAG
    step's chunk: 1 sequence, 450 new tokens after a 5,200-token cached prefix (llama-3.1-8b heads)."""
    ragged_sweep = sweep if ragged_sweep is None else ragged_sweep
    long = bench_prefill_case([qlen] * 4, [0] * 4, matmul_tflops, sweep, gen, kv_dtypes=kv_dtypes,
                              ragged_sweep=ragged_sweep)
    torch.cuda.empty_cache()
    rag = (bench_prefill_case([450], [5200], matmul_tflops, sweep, gen, kv_dtypes=kv_dtypes, ragged_sweep=ragged_sweep)
           if rag_chunk else None)
    for r in (long, rag, long.get("fp8"), rag and rag.get("fp8")):
        if r is None:
            continue
        best = [r[k] for k in ("default", "baseline", "default_sweep_best") if r.get(k, {})]
        ok = [x for x in best if "us" in x]
        r["fastest"] = min(ok, key=lambda x: x["us"]) if ok else None
    if rag is not None:
        rag["per_step_32_layers_ms"] = {
            k: 32 * rag[k]["us"] / 1e3 for k in ("default",) if "us" in rag[k]
        } | {"sdpa": 32 * rag["sdpa_us"] / 1e3}
    d = long["default"]
    return {
        **long,
        "ours_us": d.get("us"),
        "ours_TFLOPs": d.get("TFLOPs"),
        "ours_pct_matmul_peak": d.get("pct_matmul_peak"),
        "rel_err_vs_sdpa": d.get("rel_err"),
        **({"rag_chunk": rag} if rag is not None else {}),
    }


def summary_rows(prefill: dict) -> list[str]:
    """One line per (shape, cache dtype): SDPA, our default and our fastest config, as % of SDPA's speed."""
    rows = []
    for case in (prefill, prefill.get("rag_chunk")):
        if case is None:
            continue
        sdpa = case
        for r in (case, case.get("fp8")):
            if r is None:
                continue
            d, f, b = r.get("default") or {}, r.get("fastest") or {}, r.get("baseline") or {}
            cfg = {k: f[k] for k in CFG_KEYS if f.get(k)}
            if "us" not in d:
                rows.append(f"{r['shape']}: default failed: {d.get('error')}")
                continue
            rows.append(
                f"{r['shape']}: sdpa {sdpa['sdpa_us']:.0f} us ({sdpa['sdpa_TFLOPs']:.0f} TFLOP/s) | aab412d default "
                f"{b.get('us', float('nan')):.0f} us = {b.get('pct_of_sdpa_speed', float('nan')):.1f}% | ours default "
                f"{d['us']:.0f} us = {d['pct_of_sdpa_speed']:.1f}% of sdpa | fastest {f.get('us', float('nan')):.0f} us"
                f" = {f.get('pct_of_sdpa_speed', float('nan')):.1f}% {cfg or 'default'} | rel err {d['rel_err']:.1e}"
                f" | >= 90% of sdpa (issue 23): default {'yes' if d['pct_of_sdpa_speed'] >= 90 else 'NO'}, fastest "
                f"{'yes' if f.get('pct_of_sdpa_speed', 0) >= 90 else 'NO'}"
            )
            if "ragged" in r:
                rows.append(ragged_summary(r["shape"], r["ragged"]))
    return rows


def main() -> None:
    from kernel_bench_common import measure_ceilings

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path of the JSON results file")
    ap.add_argument("--sweep", action="store_true", help="also time the tile configs of PREFILL_CONFIGS")
    ap.add_argument("--ragged-sweep", action="store_true",
                    help="sweep only the ragged kernel's tiles (the paged kernel at its defaults and aab412d's)")
    ap.add_argument("--no-fp8", action="store_true", help="bf16 KV only")
    ap.add_argument("--no-rag-chunk", action="store_true", help="4 x 2,048 only (a short sweep)")
    ap.add_argument("--commit", default=None, help="git commit (default: GIT_COMMIT, else git rev-parse HEAD)")
    args = ap.parse_args()
    commit = args.commit or git_commit()
    import triton

    gen = torch.Generator(device=DEV).manual_seed(0)
    torch.manual_seed(0)
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
               "commit": commit, "command": " ".join(sys.argv), "ceilings": measure_ceilings()}
    kv = ("bf16",) if args.no_fp8 else ("bf16", "fp8")
    results["prefill"] = bench_prefill(results["ceilings"]["bf16_matmul_TFLOPs"], args.sweep, gen, kv_dtypes=kv,
                                       ragged_sweep=args.sweep or args.ragged_sweep, rag_chunk=not args.no_rag_chunk)
    results["summary"] = summary_rows(results["prefill"])
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"{results['gpu']}  matmul {results['ceilings']['bf16_matmul_TFLOPs']:.0f} TFLOP/s  commit {commit}")
    print("\n".join(results["summary"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

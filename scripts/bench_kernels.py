"""Time the Triton kernels on a CUDA GPU against torch, with bytes-moved bandwidth; write a JSON file.

Usage: python scripts/bench_kernels.py --out results.json [--sweep] [--decode-long] [--commit SHA]
(`--decode-long`: also batch 1-4 decode at 16k-128k tokens in CUDA graphs, `bench_decode_long.py`, ~30 s more.)

Ceilings measured in the same run: device-to-device copy bandwidth (bytes read + written) and a bf16
8192^3 matrix product. Decode attention (batch 64, 32 q / 8 kv heads, head_dim 128, bf16, block size 16,
shuffled block tables) is compared with torch SDPA(enable_gqa=True) on contiguous K/V of the same shapes;
shared-prefix decode (the same heads, a 4096-token shared prefix) with paged decode attention on the same data.
Prefill attention (the same heads; 4 x 2048 new tokens, and a RAG chunk of 450 tokens after a 5,200-token
cached prefix) is compared with SDPA on contiguous K/V in SDPA-equivalent FLOPs.
Times are medians of triton.testing.do_bench (CUDA events, L2 flushed between runs), in microseconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_decode_long import bench_decode_long  # noqa: E402
from bench_prefill_attention import bench_prefill  # noqa: E402
from kernel_bench_common import (  # noqa: E402
    BF16,
    DEV,
    NUM_SMS,
    bench_us,
    contiguous_kv,
    measure_ceilings,
    paged_setup,
    rel_err,
)

from kernels import (  # noqa: E402
    apply_rotary_embedding,
    apply_rotary_embedding_ref,
    build_cos_sin_cache,
    choose_num_splits,
    paged_decode_attention,
    rms_norm,
    rms_norm_ref,
    sample_tokens,
    sample_tokens_ref,
    silu_and_mul,
    silu_and_mul_ref,
    write_kv_cache,
    write_kv_cache_ref,
)
from kernels.shared_prefix_decode_attention import shared_prefix_decode_attention  # noqa: E402


def bench_decode(ctx: int, copy_gbs: float, sweep: bool, gen) -> dict:
    batch, hq, hk, d, bs = 64, 32, 8, 128, 16
    k_cache, v_cache, bt = paged_setup(batch, ctx, hk, d, bs, gen)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    q = torch.randn(batch, hq, d, device=DEV, dtype=BF16)
    scale = d**-0.5
    k, v = contiguous_kv(k_cache, bt), contiguous_kv(v_cache, bt)
    q4 = q.unsqueeze(2)  # [batch, hq, 1, d]
    ref = F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True).squeeze(2)
    t_sdpa = bench_us(lambda: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True))
    out = torch.empty_like(q)

    def run(**kw):
        return lambda: paged_decode_attention(
            q, k_cache, v_cache, bt, lens, scale, out=out, max_context_len=ctx, **kw
        )

    run()()
    err = rel_err(out, ref)
    t_ours = bench_us(run())
    nbytes = 2 * batch * ctx * hk * d * 2 + 2 * q.numel() * 2
    res = {
        "context": ctx,
        "num_splits": choose_num_splits(batch, hk, ctx, NUM_SMS),
        "ours_us": t_ours,
        "sdpa_us": t_sdpa,
        "ours_speed_pct_of_sdpa": 100 * t_sdpa / t_ours,
        "bytes": nbytes,
        "ours_pct_copy_bw": 100 * nbytes / t_ours / 1e3 / copy_gbs,
        "sdpa_pct_copy_bw": 100 * nbytes / t_sdpa / 1e3 / copy_gbs,
        "rel_err_vs_sdpa": err,
    }
    if sweep:
        variants = []
        for block_n, warps, stages, splits in itertools.product((32, 64, 128), (4, 8), (2, 3), (1, 2, 4, 8)):
            kw = dict(block_n=block_n, num_warps=warps, num_stages=stages, num_splits=splits)
            try:
                run(**kw)()
                variants.append({**kw, "us": bench_us(run(**kw), 40), "rel_err": rel_err(out, ref)})
            except Exception as e:  # e.g. out of shared memory: record and go on
                variants.append({**kw, "error": str(e)[:200]})
        res["sweep"] = variants
        ok = [x for x in variants if "us" in x]
        res["sweep_best"] = min(ok, key=lambda x: x["us"]) if ok else None
    return res


def bench_decode_small_batch(copy_gbs: float, gen) -> list[dict]:
    """Split-K check where seqs * kv_heads is small next to the SM count (ctx 16k, and the batch-1 decode
    benchmark's short context; 32/8 heads, d128)."""
    rows = []
    for batch, ctx in ((1, 16384), (8, 16384), (1, 256)):
        hq, hk, d = 32, 8, 128
        k_cache, v_cache, bt = paged_setup(batch, ctx, hk, d, 16, gen)
        lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
        q = torch.randn(batch, hq, d, device=DEV, dtype=BF16)
        nbytes = 2 * batch * ctx * hk * d * 2
        # ctx 256: the batch-1 decode benchmark's contexts (32 + up to 256 tokens), its graphs sized for 512.
        heuristic = choose_num_splits(batch, hk, ctx if ctx > 256 else 512, NUM_SMS)
        for splits in sorted({1, 2, 4, 16, 32, heuristic}):
            args = (q, k_cache, v_cache, bt, lens, 0.088)
            fn = lambda args=args, s=splits: paged_decode_attention(*args, num_splits=s)  # noqa: E731
            # A short context's kernels last a few us, less than a launch: time them inside a CUDA graph.
            t = bench_us(fn) if ctx > 256 else triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3
            row = {"batch": batch, "context": ctx, "num_splits": splits, "heuristic": splits == heuristic,
                   "timing": "eager launches" if ctx > 256 else "cuda graph replay"}
            rows.append({**row, "us": t, "pct_copy_bw": 100 * nbytes / t / 1e3 / copy_gbs})
    return rows


def bench_shared_prefix_decode(copy_gbs: float, gen, prefix: int = 4096) -> dict:
    """RAG decode step: batch 64 sharing a 4096-token prefix (same blocks) plus own suffixes of 1536-1900
    tokens; shared_prefix_decode_attention against paged_decode_attention on the same caches and tables."""
    batch, hq, hk, d, bs = 64, 32, 8, 128, 16
    suffix = torch.randint(1536, 1901, (batch,), device=DEV, generator=gen)
    own = -(-1900 // bs)
    nblk = prefix // bs + batch * own
    k_cache = torch.randn(nblk, bs, hk, d, device=DEV, dtype=BF16)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(nblk, device=DEV, generator=gen).int()
    prefix_blocks = torch.zeros(2 * prefix // bs, dtype=torch.int32, device=DEV)  # room for 8192 tokens
    prefix_blocks[: prefix // bs] = perm[: prefix // bs]
    bt = torch.cat([perm[: prefix // bs].expand(batch, -1), perm[prefix // bs :].view(batch, own)], dim=1)
    lens = (prefix + suffix).int()
    prefix_len = torch.tensor([prefix], dtype=torch.int32, device=DEV)
    q = torch.randn(batch, hq, d, device=DEV, dtype=BF16)
    out, ref = torch.empty_like(q), torch.empty_like(q)
    max_ctx = bt.shape[1] * bs
    t_paged = bench_us(lambda: paged_decode_attention(q, k_cache, v_cache, bt, lens, d**-0.5, out=ref))
    t_ours = bench_us(
        lambda: shared_prefix_decode_attention(
            q, k_cache, v_cache, bt, lens, prefix_blocks, prefix_len, d**-0.5, out=out, max_context_len=max_ctx
        )
    )
    suffix_bytes = 2 * int(suffix.sum()) * hk * d * 2
    return {
        "shape": f"batch {batch}, {hq}/{hk} heads, d{d}, bs{bs}, prefix {prefix} + suffix 1536-1900, bf16",
        "ours_us": t_ours,
        "paged_decode_us": t_paged,
        "speedup": t_paged / t_ours,
        "ours_pct_copy_bw": 100 * (suffix_bytes + 2 * prefix * hk * d * 2) / t_ours / 1e3 / copy_gbs,
        "rel_err_vs_paged": rel_err(out, ref),
    }


def bench_elementwise(copy_gbs: float, gen, n: int = 8192) -> dict:
    hidden, inter, hq, hk, d = 4096, 14336, 32, 8, 128
    x = torch.randn(n, hidden, device=DEV, dtype=BF16)
    r, w = torch.randn_like(x), torch.randn(hidden, device=DEV, dtype=BF16)
    gu = torch.randn(n, 2 * inter, device=DEV, dtype=BF16)
    cache = build_cos_sin_cache(d, 8192, 500000.0).to(DEV)
    pos = torch.randint(0, 8192, (n,), device=DEV, generator=gen)
    q, k = torch.randn(n, hq, d, device=DEV, dtype=BF16), torch.randn(n, hk, d, device=DEV, dtype=BF16)
    kc = torch.randn(n // 16 * 2, 16, hk, d, device=DEV, dtype=BF16)
    vc = torch.randn_like(kc)
    slots = torch.randperm(kc.shape[0] * 16, device=DEV, generator=gen)[:n]
    logits = torch.randn(256, 151936, device=DEV)
    temps = torch.full((256,), 0.8, device=DEV)
    seeds, offs = torch.arange(256, device=DEV), torch.zeros(256, dtype=torch.int64, device=DEV)
    cases = {
        "rms_norm_residual": (
            lambda: rms_norm(x, w, 1e-5, r),
            lambda: rms_norm_ref(x, w, 1e-5, r),
            4 * x.numel() * 2,
        ),
        "silu_and_mul": (lambda: silu_and_mul(gu), lambda: silu_and_mul_ref(gu), 3 * n * inter * 2),
        "rotary": (
            lambda: apply_rotary_embedding(pos, q, k, cache),
            lambda: apply_rotary_embedding_ref(pos, q, k, cache),
            2 * (q.numel() + k.numel()) * 2 + n * d * 4,
        ),
        "kv_write": (
            lambda: write_kv_cache(k, k, kc, vc, slots),
            lambda: write_kv_cache_ref(k, k, kc, vc, slots),
            4 * k.numel() * 2,
        ),
        "sampling": (
            lambda: sample_tokens(logits, temps, seeds, offs),
            lambda: sample_tokens_ref(logits, temps),
            logits.numel() * 4,
        ),
    }
    res = {}
    for name, (ours, eager, nbytes) in cases.items():
        t_o, t_e = bench_us(ours), bench_us(eager)
        res[name] = {"ours_us": t_o, "torch_eager_us": t_e, "bytes": nbytes, "ours_GBps": nbytes / t_o / 1e3}
        res[name]["ours_pct_copy_bw"] = 100 * res[name]["ours_GBps"] / copy_gbs
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path of the JSON results file")
    ap.add_argument(
        "--sweep", action="store_true", help="also time decode and prefill variants (block sizes, warps, stages)"
    )
    ap.add_argument("--decode-long", action="store_true", help="also time batch 1-4 decode at 16k-128k tokens")
    ap.add_argument("--sweep-prefill", action="store_true", help="time the prefill variants only (not decode's)")
    ap.add_argument("--commit", default=None, help="git commit (default: git rev-parse HEAD)")
    args = ap.parse_args()
    commit = args.commit
    if commit is None:
        git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = git.stdout.strip() or "unknown"
    gen = torch.Generator(device=DEV).manual_seed(0)
    torch.manual_seed(0)
    results = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": commit,
        "ceilings": measure_ceilings(),
    }
    copy_gbs = results["ceilings"]["copy_GBps"]
    print(f"ceilings: {results['ceilings']}", flush=True)
    results["decode"] = []
    for ctx in (1024, 4096, 16384):
        results["decode"].append(bench_decode(ctx, copy_gbs, args.sweep, gen))
        torch.cuda.empty_cache()
        print(f"decode {ctx}: {json.dumps({k: v for k, v in results['decode'][-1].items() if k != 'sweep'})}")
    results["decode_small_batch"] = bench_decode_small_batch(copy_gbs, gen)
    if args.decode_long:
        results["decode_long"] = bench_decode_long(copy_gbs, gen)
    results["shared_prefix_decode"] = bench_shared_prefix_decode(copy_gbs, gen)
    print(f"shared-prefix decode: {json.dumps(results['shared_prefix_decode'])}", flush=True)
    results["prefill"] = bench_prefill(
        results["ceilings"]["bf16_matmul_TFLOPs"], args.sweep or args.sweep_prefill, gen
    )
    results["elementwise"] = bench_elementwise(copy_gbs, gen)
    Path(args.out).write_text(json.dumps(results, indent=1))

    ceil = results["ceilings"]
    print(f"\n{results['gpu']}  copy {copy_gbs:.0f} GB/s  matmul {ceil['bf16_matmul_TFLOPs']:.0f} TFLOP/s")
    print("decode ctx | ours us | sdpa us | % of sdpa speed | ours % bw | sdpa % bw | best sweep us")
    for r in results["decode"]:
        best = r.get("sweep_best") or {}
        print(
            f"{r['context']:>10} | {r['ours_us']:7.1f} | {r['sdpa_us']:7.1f}"
            f" | {r['ours_speed_pct_of_sdpa']:15.1f} | {r['ours_pct_copy_bw']:9.1f}"
            f" | {r['sdpa_pct_copy_bw']:9.1f} | {best.get('us', float('nan')):.1f}"
        )
        if best:
            print(f"{'':>10}   best: {best}")
    for r in results["decode_small_batch"]:
        tag = " (heuristic)" if r["heuristic"] else ""
        print(f"decode batch {r['batch']} ctx {r['context']} splits {r['num_splits']}: {r['us']:.1f} us{tag}")
    for p in (results["prefill"], results["prefill"]["rag_chunk"]):
        print(f"prefill {p['shape']}: sdpa {p['sdpa_us']:.0f} us ({p['sdpa_TFLOPs']:.0f} TFLOP/s, {p['sdpa_form']})")
        for name in ("default", "default_sweep_best"):
            r = p.get(name) or {}
            cfg = {k: v for k, v in r.items() if k not in ("us", "TFLOPs", "rel_err", "pct_matmul_peak")}
            if "us" in r:
                print(f"{name:>20}: {r['us']:7.0f} us ({r['TFLOPs']:.0f} TFLOP/s, rel err {r['rel_err']:.1e}) {cfg}")
            elif r:
                print(f"{name:>20}: {r}")
    for name, r in results["elementwise"].items():
        print(f"{name:>18}: ours {r['ours_us']:8.1f} us ({r['ours_pct_copy_bw']:5.1f}% bw)", end="")
        print(f", torch eager {r['torch_eager_us']:8.1f} us")


if __name__ == "__main__":
    main()

"""Decode attention over an FP8 (e4m3) KV cache against bf16, at the 1,000 / 1,000 workload's decode shapes, in one
process: is the FP8 decode kernel what holds FP8 KV runs at 35-39% of their roofline bound (H100, c6876ad) while
bf16 reaches 65%? Writes a JSON file.

    python scripts/bench_decode_fp8.py --out results.json [--commit SHA]

llama-3.1-8b's attention (32 q / 8 kv heads, head_dim 128, KV blocks of 16, shuffled block tables), 1,536 cached
tokens a sequence (the middle of a 1,000 + 1,000 request's decode), batches 228 and 458 (what bf16 and FP8 KV ran
at on the H100's pool). Rows: a bf16 cache; an FP8 cache with bf16 dots (the served default); an FP8 cache with
fp16 dots (`fp8_f16`, kernels/paged_decode_attention.py FP8_DOT_F16). Each: microseconds (the median of
triton.testing.do_bench, L2 flushed), KV bytes read per microsecond as a share of the device-to-device copy
bandwidth measured in the same run, and the relative error against the fp32 reference over the dequantised cache.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_prefill_attention import fp8_cache  # noqa: E402
from kernel_bench_common import BF16, DEV, bench_us, measure_ceilings, paged_setup, rel_err  # noqa: E402

from kernels.fp8 import dequantize_fp8_ref  # noqa: E402
from kernels.paged_decode_attention import paged_decode_attention, paged_decode_attention_ref  # noqa: E402

HQ, HK, D, BS, CTX = 32, 8, 128, 16, 1536


def rows_for_batch(batch: int, copy_gbs: float, gen) -> list[dict]:
    k_cache, v_cache, bt = paged_setup(batch, CTX, HK, D, BS, gen)
    lens = torch.full((batch,), CTX, dtype=torch.int32, device=DEV)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=BF16)
    scale = D**-0.5
    out = torch.empty_like(q)
    (k8, ks, _), (v8, vs, _) = fp8_cache(k_cache), fp8_cache(v_cache)  # per-tensor scale amax / 448
    ref16 = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, scale)
    ref8 = paged_decode_attention_ref(q, dequantize_fp8_ref(k8, ks), dequantize_fp8_ref(v8, vs), bt, lens, scale)
    cases = (("bf16 cache", k_cache, v_cache, {}, ref16, 2),
             ("fp8 cache, bf16 dots", k8, v8, dict(k_scale=ks, v_scale=vs, fp8_f16=False), ref8, 1),
             ("fp8 cache, fp16 dots", k8, v8, dict(k_scale=ks, v_scale=vs, fp8_f16=True), ref8, 1))
    rows = []
    for name, kc, vc, kw, ref, elem_bytes in cases:
        fn = lambda kc=kc, vc=vc, kw=kw: paged_decode_attention(q, kc, vc, bt, lens, scale, out=out,  # noqa: E731
                                                                max_context_len=CTX, **kw)
        fn()
        err = rel_err(out, ref)
        t = bench_us(fn)
        kv_bytes = 2 * batch * CTX * HK * D * elem_bytes
        rows.append({"batch": batch, "context": CTX, "case": name, "us": t, "kv_bytes": kv_bytes,
                     "pct_copy_bw": 100 * kv_bytes / t / 1e3 / copy_gbs, "rel_err": err})
        print(f"batch {batch:4d} {name:22s} {t:8.1f} us  {rows[-1]['pct_copy_bw']:5.1f}% of copy bw  "
              f"rel err {err:.1e}", flush=True)
    del k_cache, v_cache, k8, v8
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path of the JSON results file")
    ap.add_argument("--commit", default=None, help="git commit (default: git rev-parse HEAD)")
    args = ap.parse_args()
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                           text=True).stdout.strip() or "unknown"
    gen = torch.Generator(device=DEV).manual_seed(0)
    torch.manual_seed(0)
    ceilings = measure_ceilings()
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "commit": commit,
               "command": " ".join(sys.argv), "ceilings": ceilings, "rows": []}
    for batch in (228, 458):
        results["rows"] += rows_for_batch(batch, ceilings["copy_GBps"], gen)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

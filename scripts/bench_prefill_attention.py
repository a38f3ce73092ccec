"""Prefill attention benchmarks (imported by scripts/bench_kernels.py): `paged_prefill_attention` (and, with
`sweep`, its tile shapes) against SDPA on contiguous K/V, in SDPA-equivalent FLOPs, for 4 x 2048 new tokens and
a RAG chunk (450 tokens after a 5,200-token cached prefix)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel_bench_common import BF16, DEV, bench_us, contiguous_kv, paged_setup, rel_err  # noqa: E402

from kernels import paged_prefill_attention  # noqa: E402

# (block_m, block_n, num_warps, num_stages)
PREFILL_CONFIGS = ((64, 64, 4, 2), (128, 64, 8, 2), (128, 64, 4, 3), (64, 32, 4, 3), (128, 32, 8, 3))


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
    q_lens: list[int], prefixes: list[int], matmul_tflops: float, sweep: bool, gen, hq=32, hk=8, d=128, bs=16
) -> dict:
    """paged_prefill_attention against SDPA on one varlen batch.

    FLOPs are SDPA-equivalent: 4 * d * heads * sum_b (q_b * prefix_b + q_b^2 / 2) (QK^T and PV over the prefix
    and the causal half of the chunk); with no prefix it is the count of earlier results files."""
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

    def timed(**kw) -> dict:
        fn = lambda: paged_prefill_attention(q, k_cache, v_cache, bt, cu, lens, scale, max_q, out=out, **kw)
        try:
            fn()
            t = bench_us(fn)
        except Exception as e:  # e.g. out of shared memory: record and go on
            return {**kw, "error": str(e)[:200]}
        return {**kw, "us": t, "TFLOPs": flops / t / 1e6, "rel_err": rel_err(out, ref)}

    res = {
        "shape": f"q_lens {q_lens} after prefixes {prefixes}, {hq}/{hk} heads, d{d}, bs{bs}, bf16",
        "flops": flops,
        "sdpa_us": t_sdpa,
        "sdpa_TFLOPs": flops / t_sdpa / 1e6,
        "sdpa_form": sdpa_form,
        "sdpa_forms": sdpa_forms,
        "default": timed(),
    }
    if "us" in res["default"]:
        res["default"]["pct_matmul_peak"] = 100 * res["default"]["TFLOPs"] / matmul_tflops
    if sweep:
        variants = [timed(block_m=bm, block_n=bn, num_warps=w, num_stages=st) for bm, bn, w, st in PREFILL_CONFIGS]
        ok = [x for x in variants if "us" in x]
        res["default_sweep"] = variants
        res["default_sweep_best"] = min(ok, key=lambda x: x["us"]) if ok else None
    return res


def bench_prefill(matmul_tflops: float, sweep: bool, gen, qlen: int = 2048) -> dict:
    """4 x 2048-token prefills (keys as in earlier results files: ours_* is the default layout) and a RAG
    step's chunk: 1 sequence, 450 new tokens after a 5,200-token cached prefix (llama-3.1-8b heads)."""
    long = bench_prefill_case([qlen] * 4, [0] * 4, matmul_tflops, sweep, gen)
    torch.cuda.empty_cache()
    rag = bench_prefill_case([450], [5200], matmul_tflops, sweep, gen)
    for r in (long, rag):
        best = [r[k] for k in ("default", "default_sweep_best") if r.get(k, {})]
        ok = [x for x in best if "us" in x]
        r["fastest"] = min(ok, key=lambda x: x["us"]) if ok else None
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
        "rag_chunk": rag,
    }

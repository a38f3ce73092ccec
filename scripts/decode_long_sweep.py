"""The `--sweep` of bench_decode_long.py: what removes the fixed cost of decode attention at batch 1 and 16k.

  A. batch 1 at 16k and 128k: two_kernel vs fused (reduce tile 16 / 32; tile 32 interleaved) x 16-132
     splits, default config;
  B. batch 1 at 16k: kernel configs (BLOCK_N x pipeline stages x warps) for two_kernel at 132 splits and
     fused at 32 and 132 splits (132 also interleaved);
  C. batch 2 and 4 at 16k: fused at 16-66 splits;
  D. batch 1 at 16k / 32k / 128k: fused at 132 programs with min_split_tokens 128-1024 (active splits from
     each context's own length), contiguous and interleaved.
Each timing is a median of CUDA graph replays (rep 25 ms); a config that fails to compile (shared memory,
registers) is recorded with its error. About 100 timings and 25 compiles: about 120 s on an H200; each part
runs in its own process (bench_decode_long.py), so a fault in one leaves the others.
"""

from __future__ import annotations

import json

import torch
from bench_decode_long import Case

SPLITS_A = (16, 32, 64, 96, 132)
MERGES_A = [dict(fuse_reduce=False)] + [dict(fuse_reduce=True, reduce_tile=t) for t in (16, 32)] + [
    dict(fuse_reduce=True, reduce_tile=32, interleave=True)]
CONFIGS_B = [(64, 3, 4), (32, 3, 4), (32, 2, 4), (64, 2, 4), (64, 4, 4), (128, 2, 4), (64, 3, 8)]
PATHS_B = [dict(fuse_reduce=False, num_splits=132), dict(fuse_reduce=True, num_splits=32),
           dict(fuse_reduce=True, num_splits=132), dict(fuse_reduce=True, num_splits=132, interleave=True)]
SPLITS_C = {2: (16, 32, 66), 4: (16, 32, 33)}
CONTEXTS = (16384, 131072)  # A at both, B at the first, C at the first
CONTEXTS_D, MIN_SPLIT_TOKENS_D = (16384, 32768, 131072), (128, 256, 512, 1024)


def timed(case: Case, label: dict, **kw) -> dict:
    row = {**label, **kw}
    try:
        row.update(case.time(rep=25, **kw))
    except Exception as e:  # e.g. out of shared memory or registers: record and go on
        row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    print(json.dumps(row), flush=True)
    return row


PARTS = "ABCD"


def sweep(copy_gbs: float, gen, parts: str = PARTS) -> list[dict]:
    rows = []
    for ctx in CONTEXTS if ("A" in parts or "B" in parts) else ():
        case = Case(1, ctx, copy_gbs, gen)
        for merge in MERGES_A if "A" in parts else ():
            for splits in SPLITS_A:
                rows.append(timed(case, {"part": "A", "batch": 1, "context": ctx}, num_splits=splits, **merge))
        if ctx == CONTEXTS[0] and "B" in parts:
            for block_n, stages, warps in CONFIGS_B:
                for path in PATHS_B:
                    rows.append(timed(case, {"part": "B", "batch": 1, "context": ctx}, block_n=block_n,
                                      num_stages=stages, num_warps=warps, **path))
        del case
        torch.cuda.empty_cache()
    for batch, splits_list in SPLITS_C.items() if "C" in parts else ():
        case = Case(batch, CONTEXTS[0], copy_gbs, gen)
        for splits in splits_list:
            rows.append(timed(case, {"part": "C", "batch": batch, "context": CONTEXTS[0]}, num_splits=splits,
                              fuse_reduce=True))
        del case
        torch.cuda.empty_cache()
    for ctx in CONTEXTS_D if "D" in parts else ():
        case = Case(1, ctx, copy_gbs, gen)
        for interleave in (False, True):
            for mst in MIN_SPLIT_TOKENS_D:
                rows.append(timed(case, {"part": "D", "batch": 1, "context": ctx}, num_splits=132,
                                  fuse_reduce=True, interleave=interleave, min_split_tokens=mst))
        del case
        torch.cuda.empty_cache()
    return rows


def summarise(rows: list[dict]) -> dict:
    """Fastest timing per (batch, context, merge path, interleaved or not)."""
    best: dict[str, dict] = {}
    for r in rows:
        if "us" not in r:
            continue
        path = ("fused" if r.get("fuse_reduce") else "two_kernel") + ("_interleaved" if r.get("interleave") else "")
        key = f"batch{r['batch']}_ctx{r['context']}_{path}"
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    return best

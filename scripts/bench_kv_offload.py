"""KV offload copies on a CUDA GPU (`--kv-offload-size`): the model runner's `KVOffloader` on llama-3.1-8b's
KV shapes (32 layers, 8 kv heads, head_dim 128, block size 16, bf16: 2 MiB per block), offloading 2,048 blocks
(4 GiB) GPU -> pinned host and restoring them into other GPU blocks, timed with CUDA events on the compute
stream (so the figure includes the side stream's ordering), and checked bit-identical. The capacity model
prices copies at this benchmark's H200 figures (`shared_engine/sim/simulator.py`, `GPU_OFFLOAD_BANDWIDTH`,
`GPU_RESTORE_BANDWIDTH`).

Usage: python scripts/bench_kv_offload.py --out benchmarks/results/kv_offload_h200.json
(about 30 s on an H200: 8 GiB of device KV, 4 GiB pinned, 3 timed rounds each way).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shared_engine.model_executor.kv_offloader import KVOffloader  # noqa: E402

LAYERS, HEADS, HEAD_DIM, BS = 32, 8, 128, 16
GPU_BLOCKS, MOVED = 4096, 2048


def timed(fn) -> float:
    """Seconds from the compute stream's view: recorded before `fn`, and after the stream waits for it."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path of the JSON results file")
    args = ap.parse_args()
    torch.manual_seed(0)
    caches = [torch.randn(2, GPU_BLOCKS, BS, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
              for _ in range(LAYERS)]
    offloader = KVOffloader(caches, MOVED)
    block_bytes = LAYERS * 2 * BS * HEADS * HEAD_DIM * 2
    gen = torch.Generator().manual_seed(0)
    src = torch.randperm(GPU_BLOCKS, generator=gen)[:MOVED].tolist()  # scattered GPU blocks
    taken = set(src)
    dst = [b for b in range(GPU_BLOCKS) if b not in taken][:MOVED]
    slots = torch.randperm(MOVED, generator=gen).tolist()  # scattered host slots too
    before = [torch.stack([c[:, b] for c in caches]) for b in src[:64]]
    rounds = []
    for _ in range(3):
        t_off = timed(lambda: offloader.run(list(zip(src, slots)), []))
        t_res = timed(lambda: offloader.run([], list(zip(slots, dst))))
        rounds.append({"offload_s": t_off, "restore_s": t_res, "offload_GBps": MOVED * block_bytes / t_off / 1e9,
                       "restore_GBps": MOVED * block_bytes / t_res / 1e9})
        print(json.dumps(rounds[-1]), flush=True)
    identical = all(torch.equal(b, torch.stack([c[:, d] for c in caches])) for b, d in zip(before, dst[:64]))
    commit = os.environ.get("GIT_COMMIT") or subprocess.run(  # the device copy has no .git
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "commit": commit or "unknown",
               "command": "python scripts/bench_kv_offload.py --out " + args.out,
               "shapes": {"layers": LAYERS, "kv_heads": HEADS, "head_dim": HEAD_DIM, "block_size": BS,
                          "dtype": "bf16", "block_bytes": block_bytes, "blocks_moved": MOVED,
                          "staging_blocks": offloader.chunk},
               "bit_identical_first_64": identical, "rounds": rounds}
    Path(args.out).write_text(json.dumps(results, indent=1))
    best = max(rounds, key=lambda r: r["offload_GBps"] + r["restore_GBps"])
    print(f"{results['gpu']}: offload {best['offload_GBps']:.1f} GB/s, restore {best['restore_GBps']:.1f} GB/s, "
          f"bit-identical {identical}")
    if not identical:
        sys.exit("restored blocks differ from the offloaded ones")


if __name__ == "__main__":
    main()

"""The well-behaved tenants' TTFT tail from a load test's samples file, with and without the phase's first
seconds, and the slowest requests with their time in the phase: what a p99 of a few hundred requests is made of.

    python case_multilora/loadtest/tail_report.py case_multilora/the_fix/h200q_a44ddab/samples-isolated.jsonl \
        case_multilora/the_fix/h200q_a44ddab/samples-the_fix.jsonl --skip-s 10

A samples file (`async_users.py`) has one JSON object per request: `kind` ("well-behaved" or "whale"),
`tenant`, `t_s` (seconds since the phase began), `status`, `ttft_s` (seconds; null if no token came).
Percentiles are `run_loadtest.percentile`'s (nearest rank), the rule of the case's results files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from case_multilora.loadtest.run_loadtest import percentile  # noqa: E402


def tail(path: Path, skip_s: float, top: int = 8) -> dict:
    """Well-behaved TTFT figures (ms) of one samples file: all, after `skip_s`, and the `top` slowest.

    Raises:
        ValueError: no well-behaved request with a first token (after `skip_s`).
    """
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    timed = [r for r in rows if r.get("kind") == "well-behaved" and r.get("ttft_s") is not None]
    ms = [r["ttft_s"] * 1000 for r in timed]
    later = [r["ttft_s"] * 1000 for r in timed if r["t_s"] > skip_s]
    if not ms or not later:
        raise ValueError(f"{path}: no well-behaved TTFTs (after {skip_s} s)")
    slowest = sorted(timed, key=lambda r: -r["ttft_s"])[:top]
    return {"file": str(path), "num": len(ms), "p50_ms": round(percentile(ms, 50), 1),
            "p99_ms": round(percentile(ms, 99), 1), "skip_s": skip_s, "num_after_skip": len(later),
            "p99_after_skip_ms": round(percentile(later, 99), 1),
            "slowest": [{"t_s": r["t_s"], "tenant": r["tenant"], "ttft_ms": round(r["ttft_s"] * 1000, 1)}
                        for r in slowest]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("samples", type=Path, nargs="+")
    p.add_argument("--skip-s", type=float, default=10.0, help="leave out requests sent in the first seconds")
    args = p.parse_args(argv)
    for path in args.samples:
        print(json.dumps(tail(path, args.skip_s)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

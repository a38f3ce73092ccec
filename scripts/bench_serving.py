"""Serving benchmark against an OpenAI-compatible server, with `vllm bench serve`'s workload knobs, printed
block and JSON keys.

    python scripts/bench_serving.py --base-url http://127.0.0.1:8000 --dataset-name random \
        --random-input-len 128 --random-output-len 64 --num-prompts 100 --request-rate 4 --burstiness 1 \
        --max-concurrency 16 --seed 0 --result-file results.json

Arrivals: `--request-rate inf` sends everything at once; otherwise gaps are gamma-distributed with shape
`--burstiness` and mean 1/rate (burstiness 1 = Poisson). Prompts are token ids (exact input lengths).
TTFT is the first streamed token, ITL the gaps between later chunks, TPOT (E2EL - TTFT) / (output - 1).
The results file records the hardware, model, server engine config, benchmark config and commit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass
class Sample:
    prompt: list[int]
    output_len: int


@dataclass
class Result:
    success: bool = False
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str = ""


# ---- datasets ----------------------------------------------------------------------------------------
def random_dataset(rng, vocab: int, num: int, input_len: int, output_len: int, range_ratio: float) -> list[Sample]:
    """Input/output lengths uniform in [len * (1 - r), len * (1 + r)]; random token ids."""
    ins = rng.integers(max(1, int(input_len * (1 - range_ratio))), int(input_len * (1 + range_ratio)) + 1, num)
    outs = rng.integers(max(1, int(output_len * (1 - range_ratio))), int(output_len * (1 + range_ratio)) + 1, num)
    return [Sample(rng.integers(100, vocab, int(i)).tolist(), int(o)) for i, o in zip(ins, outs)]


def prefix_repetition_dataset(rng, vocab: int, num: int, prefix_len: int, suffix_len: int, num_prefixes: int,
                              output_len: int) -> list[Sample]:
    """`num_prefixes` shared prefixes, each request one of them plus its own random suffix."""
    prefixes = [rng.integers(100, vocab, prefix_len).tolist() for _ in range(num_prefixes)]
    samples = [Sample(prefixes[i % num_prefixes] + rng.integers(100, vocab, suffix_len).tolist(), output_len)
               for i in range(num)]
    rng.shuffle(samples)
    return samples


# ---- one request -------------------------------------------------------------------------------------
async def send(client: httpx.AsyncClient, url: str, model: str, sample: Sample, ignore_eos: bool) -> Result:
    body = {"model": model, "prompt": sample.prompt, "max_tokens": sample.output_len, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": ignore_eos}
    result = Result(prompt_len=len(sample.prompt))
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    result.error = chunk["error"]["message"]
                    return result
                if chunk.get("usage"):
                    result.output_len = chunk["usage"]["completion_tokens"]
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    now = time.perf_counter()
                    if result.ttft == 0.0:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
        result.latency = time.perf_counter() - start
        result.success = True
    except httpx.HTTPError as e:
        result.error = repr(e)
    return result


async def arrivals(n: int, rate: float, burstiness: float, rng):
    """Yield request indices, waiting gamma(shape=burstiness, mean=1/rate) seconds between them."""
    for i in range(n):
        yield i
        if rate != float("inf") and i < n - 1:
            await asyncio.sleep(rng.gamma(burstiness, 1.0 / (rate * burstiness)))


async def run(args, samples: list[Sample], model: str) -> tuple[list[Result], float]:
    sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
    limits = httpx.Limits(max_connections=args.max_concurrency or len(samples))
    url = args.base_url.rstrip("/") + "/v1/completions"
    rng = np.random.default_rng(args.seed + 1)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        async def limited(sample):
            if sem is None:
                return await send(client, url, model, sample, args.ignore_eos)
            async with sem:
                return await send(client, url, model, sample, args.ignore_eos)

        start = time.perf_counter()
        tasks = [asyncio.create_task(limited(samples[i]))
                 async for i in arrivals(len(samples), args.request_rate, args.burstiness, rng)]
        results = await asyncio.gather(*tasks)
    return results, time.perf_counter() - start


# ---- report ------------------------------------------------------------------------------------------
def metrics(results: list[Result], duration: float) -> dict:
    ok = [r for r in results if r.success]
    ttfts = [r.ttft for r in ok]
    tpots = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    itls = [x for r in ok for x in r.itl]
    e2els = [r.latency for r in ok]
    total_in, total_out = sum(r.prompt_len for r in ok), sum(r.output_len for r in ok)
    out = {
        "duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration, "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
        "input_lens": [r.prompt_len for r in results], "output_lens": [r.output_len for r in results],
        "ttfts": ttfts, "itls": [r.itl for r in results], "errors": [r.error for r in results],
    }
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        arr = np.asarray(values or [0.0]) * 1000
        out.update({f"mean_{name}_ms": float(arr.mean()), f"median_{name}_ms": float(np.median(arr)),
                    f"std_{name}_ms": float(arr.std()), f"p99_{name}_ms": float(np.percentile(arr, 99))})
    return out


def print_block(m: dict, args) -> None:
    line = lambda label, value: print(f"{label:<40} {value:<10}")
    print("{:=^50}".format(" Serving Benchmark Result "))
    line("Successful requests:", m["completed"])
    line("Failed requests:", m["failed"])
    if args.max_concurrency:
        line("Maximum request concurrency:", args.max_concurrency)
    line("Request rate configured (RPS):", f"{args.request_rate:.2f}")
    line("Benchmark duration (s):", f"{m['duration']:.2f}")
    line("Total input tokens:", m["total_input_tokens"])
    line("Total generated tokens:", m["total_output_tokens"])
    line("Request throughput (req/s):", f"{m['request_throughput']:.2f}")
    line("Output token throughput (tok/s):", f"{m['output_throughput']:.2f}")
    line("Total Token throughput (tok/s):", f"{m['total_token_throughput']:.2f}")
    titles = {"ttft": ("Time to First Token", "TTFT"), "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
              "itl": ("Inter-token Latency", "ITL"), "e2el": ("End-to-end Latency", "E2EL")}
    for key, (title, short) in titles.items():
        print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        line(f"Mean {short} (ms):", f"{m[f'mean_{key}_ms']:.2f}")
        line(f"Median {short} (ms):", f"{m[f'median_{key}_ms']:.2f}")
        line(f"P99 {short} (ms):", f"{m[f'p99_{key}_ms']:.2f}")
    print("=" * 50)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="default: the server's first model")
    p.add_argument("--dataset-name", choices=["random", "prefix_repetition"], default="random")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--random-input-len", type=int, default=128)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--prefix-repetition-prefix-len", type=int, default=256)
    p.add_argument("--prefix-repetition-suffix-len", type=int, default=64)
    p.add_argument("--prefix-repetition-num-prefixes", type=int, default=4)
    p.add_argument("--prefix-repetition-output-len", type=int, default=64)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", type=Path, default=None)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.burstiness <= 0:
        raise SystemExit("--burstiness must be > 0")
    base = args.base_url.rstrip("/")
    card = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]
    model = args.model or card["id"]
    server = httpx.get(base + "/version", timeout=30).json()
    vocab = int(card.get("vocab_size") or 32000)
    rng = np.random.default_rng(args.seed)
    if args.dataset_name == "random":
        samples = random_dataset(rng, vocab, args.num_prompts, args.random_input_len, args.random_output_len,
                                 args.random_range_ratio)
    else:
        samples = prefix_repetition_dataset(rng, vocab, args.num_prompts, args.prefix_repetition_prefix_len,
                                            args.prefix_repetition_suffix_len, args.prefix_repetition_num_prefixes,
                                            args.prefix_repetition_output_len)
    results, duration = asyncio.run(run(args, samples, model))
    m = metrics(results, duration)
    print_block(m, args)
    if args.result_file:
        from benchmarks.env_info import environment

        record = {"backend": "openai", "model_id": model, "num_prompts": args.num_prompts,
                  "request_rate": args.request_rate, "burstiness": args.burstiness,
                  "max_concurrency": args.max_concurrency, **environment(),
                  "model": card, "engine_config": server.get("engine_config"),
                  "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, **m}
        args.result_file.parent.mkdir(parents=True, exist_ok=True)
        args.result_file.write_text(json.dumps(record, indent=1))
    return 0 if m["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

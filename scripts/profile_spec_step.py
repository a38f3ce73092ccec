"""Where a speculative step's time goes, kernel by kernel (issue 17): --model (llama-3.1-8b, dummy) drafted for by
--draft-model (llama-3.2-1b; `draft_model`, k = --k, policy `always`) at batch 1, drafts replaced by the replay
proposer's with forced acceptance at --acceptance (BENCHMARK ONLY: bench_spec_decode.py's `DraftCostReplayProposer`:
each step still pays for the draft's proposal). (1) Plain decode (speculation off) and speculative step: --steps steps
unprofiled (`StepCost`), then profiled: per step device ms, events, idle gaps between consecutive events, the top
--top kernels. (2) Sections: wrappers set here (no engine file touched) on the draft's `propose` (in it `_first_step`,
`_fused`, `_catch_up`, `mirror`) and the target's `launch` (`compute_logits`, `_verify`, `_sample`) enqueue a marker
kernel (`torch.cuda._sleep(0)`) at each call's start and end; on one stream the i-th marker traced is the i-th
enqueued, so each event (and the idle gap before it) falls in the innermost open section. (3) Bare batch-1 forwards
(CUDA events, graph replays; last: they overwrite KV): draft decode, k + 2-token step 0, fused k - 1 steps, target
decode, k + 1-token verify; weight bytes / copy bandwidth.

    PYTHONPATH=. python scripts/profile_spec_step.py --out benchmarks/results/profile_spec_step_h200.json
    # CPU smoke: the default model, its first 6 layers as the draft, eager, top-level CPU ops (figures meaningless)
    python scripts/profile_spec_step.py --device cpu --input-len 128 --output-len 48 --steps 2 --out /tmp/p.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from benchmarks.env_info import environment  # noqa: E402
from scripts.bench_spec_decode import draft_cost_replay  # noqa: E402
from scripts.profile_steps import measure_ceilings  # noqa: E402
from scripts.spec_code_workload import draft_model_dir  # noqa: E402
from scripts.spec_step_cost import StepCost, set_speculation  # noqa: E402
from shared_engine import LLM, SamplingParams  # noqa: E402
from shared_engine.core.request import Request  # noqa: E402
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput  # noqa: E402
from shared_engine.model_executor.input_builder import build_inputs  # noqa: E402

MARKER = "spin_kernel"  # torch.cuda._sleep's kernel (on the CPU: a record_function range of that name)
STATE = {"cuda": True, "on": False, "labels": []}  # sections: markers on, (sign, section) per marker enqueued


sync = lambda: STATE["cuda"] and torch.cuda.synchronize()  # noqa: E731


def device_events(prof) -> list[tuple[float, float, str]]:
    """(start us, end us, name) by start: device events on CUDA, top-level CPU ops on the CPU."""
    rows = [(float(e.time_range.start), float(e.time_range.end), e.name) for e in prof.events() if
            (getattr(e.device_type, "name", "") == "CUDA") == STATE["cuda"] and (STATE["cuda"] or e.cpu_parent is None)]
    return sorted(r for r in rows if r[1] > r[0] or MARKER in r[2])


def summarise(events, steps: int, top: int, gaps: bool = True) -> dict:
    """Per step: device ms and events, (`gaps`) span and idle gaps, and the top `top` by time (name sans args)."""
    if not (events := [e for e in events if MARKER not in e[2]]):
        return {"error": "no device events traced"}
    by: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    idle, covered = 0.0, events[0][1]
    for start, end, name in events:
        name = name.replace("(anonymous namespace)", "{anon}").removeprefix("void ")
        key = (name if name.startswith("Mem") else name.split("(")[0])[:160]
        by[key][0], by[key][1] = by[key][0] + end - start, by[key][1] + 1
        idle, covered = idle + max(0.0, start - covered), max(covered, end)
    total = sum(v[0] for v in by.values())
    row = {"gpu_ms_per_step": total / 1e3 / steps, "kernels_per_step": len(events) / steps}
    if gaps:
        row.update(span_ms_per_step=(covered - events[0][0]) / 1e3 / steps, idle_ms_per_step=idle / 1e3 / steps)
    row["top"] = [{"name": k, "ms_per_step": us / 1e3 / steps, "count_per_step": n / steps, "mean_us": us / n,
                   "share": us / total} for k, (us, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]]
    return row


def wrap(obj, attr: str) -> None:
    """While STATE["on"], each call of obj.attr enqueues a marker at its start and at its end."""
    if (original := getattr(obj, attr, None)) is None:  # renamed in the engine: that section is left out
        return

    def mark(sign: str) -> None:
        with contextlib.nullcontext() if STATE["cuda"] else record_function(MARKER):
            _ = STATE["cuda"] and torch.cuda._sleep(0)
        STATE["labels"].append((sign, attr))

    def wrapper(*args, **kwargs):
        _ = STATE["on"] and mark("+")  # "on" changes between engine steps only
        try:
            return original(*args, **kwargs)
        finally:
            _ = STATE["on"] and mark("-")

    setattr(obj, attr, wrapper)


def attribute(events, steps: int, top: int) -> dict:
    """Per section: exclusive (it innermost; with the idle gaps before those events) and inclusive (it open)
    figures, and the top kernels of `propose` and `launch` (inclusive); "other": outside every section."""
    if (traced := sum(MARKER in e[2] for e in events)) != len(STATE["labels"]):
        return {"error": f"{traced} markers traced, {len(STATE['labels'])} enqueued"}
    marks, stack, covered = iter(STATE["labels"]), [], None
    own: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0.0])  # exclusive us, events, idle us before
    inside: dict[str, list] = defaultdict(list)
    for start, end, name in events:
        if MARKER in name:
            sign, section = next(marks)
            stack.append(section) if sign == "+" else stack.pop()  # noqa: B018
        else:
            row = own[stack[-1] if stack else "other"]
            row[0], row[1] = row[0] + end - start, row[1] + 1
            row[2] += 0.0 if covered is None else max(0.0, start - covered)
            for section in set(stack) or {"other"}:
                inside[section].append((start, end, name))
        covered = end if covered is None else max(covered, end)
    out = {s: {"exclusive_ms_per_step": us / 1e3 / steps, "exclusive_kernels_per_step": n / steps,
               "idle_before_ms_per_step": gap / 1e3 / steps,
               "inclusive_ms_per_step": sum(e - s0 for s0, e, _ in inside[s]) / 1e3 / steps}
           for s, (us, n, gap) in own.items()}
    for s in ("propose", "launch"):
        if inside[s]:
            out.setdefault(s, {})["inclusive"] = summarise(inside[s], steps, top, gaps=False)
    return out


def build(args):
    """The LLM (speculation on, `DraftCostReplayProposer`, forced acceptance) and the draft's runner."""
    cpu = args.device == "cpu"
    llm = LLM(None if cpu else args.model, benchmark_forced_acceptance=True, device=args.device,
              load_format="auto" if cpu else args.load_format, enforce_eager=args.enforce_eager or cpu,
              max_model_len=args.input_len + args.output_len + 64, max_num_seqs=args.max_num_seqs,
              **({} if cpu else {"gpu_memory_utilization": args.gpu_memory_utilization}),
              speculative_config={"method": "draft_model", "num_speculative_tokens": args.k, "policy": "always",
                                  "model": draft_model_dir(args.cpu_draft_layers) if cpu else args.draft_model})
    spec = llm.engine.spec
    spec.proposer = draft_cost_replay(spec)
    spec.proposer.acceptance_rate = args.acceptance
    return llm, spec.proposer.draft.draft  # DraftCostReplayProposer -> DraftModelProposer -> DraftModelRunner


def run_request(engine, rid, prompt, params, args, windows, sections: bool = False) -> list[dict]:
    """One request: --skip steps, then per window ("cost": `StepCost` only; "trace": profiled too) --steps
    steps, then the rest. Each window's report."""
    if engine.spec is not None:
        engine.spec.proposer.reseed(0)  # the same acceptance marks for every request
    engine.add_request(rid, prompt, params)
    for _ in range(args.skip):
        engine.step()
    reports = []
    activity = ProfilerActivity.CUDA if STATE["cuda"] else ProfilerActivity.CPU
    for kind in windows:
        sync()
        with profile(activities=[activity]) if kind == "trace" else contextlib.nullcontext() as prof:
            cost, steps = StepCost(engine), 0
            STATE.update(on=sections and prof is not None, labels=[])
            while steps < args.steps and engine.has_unfinished_requests():
                engine.step()
                steps += 1
            sync()
            STATE["on"] = False
            reports.append({"window": kind, "steps": steps, "step_cost": cost.report()})
        if prof is not None:
            events = device_events(prof)
            reports[-1]["kernels"] = summarise(events, max(steps, 1), args.top)
            if sections:
                reports[-1]["sections"] = attribute(events, max(steps, 1), args.top)
    while engine.has_unfinished_requests():
        engine.step()
    return reports


def bare_forwards(engine, draft, args) -> dict:
    """Batch-1 forwards (ms per call) of the draft and the target against their weight-streaming floor."""
    cuda, context, k = STATE["cuda"], args.input_len + args.output_len // 2, args.k

    def timer(fn, iters: int = 30) -> float:
        """ms per call over `iters` calls after 3 warm-up ones: CUDA events (the wall clock on the CPU)."""
        events = [torch.cuda.Event(enable_timing=True) for _ in range(2)] if cuda else []
        for i in range(iters + 3):
            if i == 3:
                sync()
                started = time.perf_counter()
                _ = events and events[0].record()
            fn()
        _ = events and events[1].record()
        sync()
        return events[0].elapsed_time(events[1]) / iters if cuda else (time.perf_counter() - started) * 1e3 / iters

    def forward(runner, query: int, drafts: bool) -> tuple[dict, object]:
        """ms of the forward alone and with its logits' argmax (k + 1 rows with `drafts`)."""
        bs, graphs = runner.block_size, runner.graph_runner
        request = Request("bare", [5] * context, SamplingParams(max_tokens=1), max_tokens=1)
        item = ScheduledRequest(request, [7] * query, context - query, list(range(-(-context // bs))), True,
                                query - 1 if drafts else 0)
        inputs = build_inputs(SchedulerOutput([item], num_batched_tokens=query), bs, runner.device)
        key = None if graphs is None else graphs.select(inputs.meta, query)

        def run(logits: bool):
            hidden = graphs.run(key, inputs.input_ids, inputs.positions, inputs.meta) if key is not None else \
                runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta, runner.backend)
            _ = logits and runner.model.compute_logits(hidden[inputs.sample_indices]).argmax(dim=-1)

        return {"query": query, "graph_key": key and list(key), "ms": timer(lambda: run(False)),
                "ms_with_logits": timer(lambda: run(True))}, inputs

    ceilings = measure_ceilings("cuda" if cuda else "cpu", engine.runner.dtype)
    result = {"context": context, "ceilings": ceilings}
    with torch.inference_mode():
        for name, runner, shapes in (("draft", draft.runner, [(1, False), (k + 2, False)]),
                                     ("target", engine.runner, [(1, False), (k + 1, True)])):
            rows, inputs = map(list, zip(*(forward(runner, *shape) for shape in shapes)))
            first, fused = inputs[0], draft.fused if name == "draft" and k > 1 else None
            key = fused and fused.select(1, k - 1, first.meta.block_tables.shape[1])
            if key:
                ms = timer(lambda: draft.fused.run(key, first.input_ids, first.positions, first.meta))  # noqa: B023
                rows.append({"fused_steps": k - 1, "ms": ms, "ms_per_step": ms / (k - 1)})
            weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
            result[name] = {"weight_bytes": weights, "forwards": rows,
                            "weight_stream_ms": 1e3 * weights / ceilings["copy_bytes_per_s"]}
    return result


def report(result: dict) -> None:
    def table(title: str, summary: dict, cost: dict | None = None) -> None:
        if "top" not in summary:
            return print(f"== {title}: {summary}")
        line = f"== {title}: {summary['gpu_ms_per_step']:.3f} ms device, {summary['kernels_per_step']:.1f} events"
        if "span_ms_per_step" in summary:
            line += f", span {summary['span_ms_per_step']:.3f}, idle {summary['idle_ms_per_step']:.3f} ms"
        line += "" if cost is None else (f" | unprofiled: wall {cost['wall_ms_per_step']:.3f}, GPU span "
                                         f"{cost['gpu_span_ms_per_step']:.3f}, draft propose GPU "
                                         f"{cost.get('draft_propose_gpu_ms_per_step', 0.0):.3f} ms")
        print(line + f" per step\n   {'ms/step':>8} {'share':>6} {'n/step':>6} {'mean us':>8}  kernel")
        for r in summary["top"]:
            print(f"   {r['ms_per_step']:8.4f} {r['share']:6.1%} {r['count_per_step']:6.1f} {r['mean_us']:8.2f}  "
                  f"{r['name'][:100]}")

    for name in ("plain", "spec"):
        table(f"{name} step", result[name]["trace"]["kernels"], result[name]["cost"]["step_cost"])
    rows = result["sections"].get("sections", {})
    for s, r in sorted(rows.items()):
        print(f"-- section {s:14} exclusive {r['exclusive_ms_per_step']:.3f} ms ({r['exclusive_kernels_per_step']:.1f} "
              f"events), idle before {r['idle_before_ms_per_step']:.3f}, inclusive {r['inclusive_ms_per_step']:.3f} "
              "ms/step" if "exclusive_ms_per_step" in r else f"-- section {s}: {r}")
    for s in ("propose", "launch"):
        if "inclusive" in rows.get(s, {}):
            table(f"section {s} (inclusive)", rows[s]["inclusive"])
    for name, row in [(n, r) for n, r in (result["bare"] or {}).items() if n in ("draft", "target")]:
        shapes = "; ".join(f"q={f['query']} {f['ms']:.3f} (+logits {f['ms_with_logits']:.3f})" if "query" in f
                           else f"fused {f['fused_steps']} steps {f['ms']:.3f}" for f in row["forwards"])
        print(f"== bare {name}: {row['weight_bytes'] / 1e9:.2f} GB, floor {row['weight_stream_ms']:.3f}; {shapes} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default, help_ in (
            ("--model", "llama-3.1-8b", None), ("--draft-model", "llama-3.2-1b", None),
            ("--load-format", "dummy", None), ("--device", "cuda", "cuda, or cpu: the smoke run"),
            ("--cpu-draft-layers", 6, "CPU: the default model's first N layers draft"),
            ("--k", 5, None), ("--acceptance", 0.8, None), ("--input-len", 1000, None),
            ("--output-len", 96, "per request (k=5, a=0.8: ~26 speculative steps)"),
            ("--skip", 3, "steps of each request before its windows"), ("--steps", 5, "steps per window"),
            ("--top", 25, None), ("--max-num-seqs", 8, None), ("--gpu-memory-utilization", 0.5, None)):
        p.add_argument(flag, type=type(default), default=default, help=help_)
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (always eager on the CPU)")
    p.add_argument("--no-bare", action="store_true", help="skip the bare forward timings")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    started, STATE["cuda"] = time.time(), args.device != "cpu"
    llm, draft = build(args)
    engine, spec = llm.engine, llm.engine.spec
    prompt = [random.Random(0).randint(100, 10000) for _ in range(args.input_len)]
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    set_speculation(engine, spec, False)  # the recording, which also warms up and caches the prompt's KV
    outs = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    spec.proposer.record(prompt, outs[0].outputs[0].token_ids)
    plain = run_request(engine, "plain", prompt, params, args, ["cost", "trace"])
    set_speculation(engine, spec, True, reset_prefix_cache=False)
    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)  # speculative warm-up
    spec_run = run_request(engine, "spec", prompt, params, args, ["cost", "trace"])
    for obj, attrs in ((draft, ("propose", "_first_step", "_fused", "_catch_up", "mirror")),
                       (engine.runner, ("launch", "_verify", "_sample")), (engine.runner.model, ("compute_logits",))):
        for attr in attrs:
            wrap(obj, attr)
    result = {"benchmark": "profile_spec_step (the draft model's proposal, then replay drafts with forced acceptance: "
                           "BENCHMARK ONLY)", **environment(), "command": " ".join(sys.argv), "args": vars(args),
              "plain": {"cost": plain[0], "trace": plain[1]}, "spec": {"cost": spec_run[0], "trace": spec_run[1]},
              "sections": run_request(engine, "spec_sections", prompt, params, args, ["trace"], sections=True)[0]}
    result["bare"] = None if args.no_bare else bare_forwards(engine, draft, args)
    result["wall_seconds"] = time.time() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    report(result)
    print(f"wrote {args.out} ({result['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()

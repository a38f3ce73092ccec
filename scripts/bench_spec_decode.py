"""Speculative decoding benchmarks: acceptance and speed-up against speculation off, in one engine per run.

`--workload code` (CPU, default model): code editing built from this repository's own source files (a file
in the prompt, then a request to return it with one change); every request alone (batch 1), greedy, with
speculation off and each of --methods (policy `always`, k = --k): `ngram`, `suffix`, and `draft_model` with
the default model's first N layers as the draft for each N in --draft-layers (`model_loader/layer_subset.py`;
0: the model itself). Reports acceptance (accepted / drafted tokens), mean accepted length and the batch-1 speed-up (off
time / on time for the same tokens).

`--workload replay` (GPU, dummy weights; BENCHMARK-ONLY PROPOSER): dummy weights accept nothing a real
proposer drafts, so the speculative step is measured with `replay`, which drafts the target's own greedy
continuation (recorded by the run with speculation off) with each token right with probability
--acceptance (spec_decode/replay_proposer.py). Batch-1 ITL at each acceptance x k, and throughput of
--batch-sizes requests of --input-len / --output-len tokens with the auto policy against speculation off.
With `--draft-model NAME` (e.g. the `llama-3.2-1b` preset) the engine runs the `draft_model` method, so every
step pays for the draft model's forwards and KV mirror, but the drafts it returns are replaced by the replay
ones (`DraftCostReplayProposer`, BENCHMARK ONLY): what a draft model of that size costs at a set acceptance.
With `--calibration-len N`, each batch > 1 also gets short (N-token) off and `always` runs, and once batch 1's,
whose step costs calibrate the simulator's predicted throughput ratio for each timed (policy, k)
(scripts/spec_sim_predict.py), computed before those runs and stored beside each measured ratio with its
relative error. `--policies auto --time-recording --batch1-prompts 0` times only off and auto (issue 17's
1,000 / 1,000 workload in one device call: scripts/gpu_spec_check.sh, STEPS=bench1000).

    python scripts/bench_spec_decode.py --workload code --out benchmarks/results/spec_decode_cpu_code.json
    python scripts/bench_spec_decode.py --workload code --methods draft_model --draft-layers 0 6 \\
        --out benchmarks/results/spec_decode_cpu_code_draft_model.json
    python scripts/bench_spec_decode.py --workload replay --model llama-3.1-8b --load-format dummy \\
        --out benchmarks/results/spec_decode_h200_replay.json
    python scripts/bench_spec_decode.py --workload replay --model llama-3.1-8b --load-format dummy \\
        --draft-model llama-3.2-1b --batch-sizes 0 --out benchmarks/results/spec_decode_h200_draft_cost.json
    python scripts/bench_spec_decode.py --workload replay --model llama-3.1-8b --load-format dummy \\
        --output-len 1000 --policies auto --time-recording --batch1-prompts 0 --calibration-len 32 \\
        --out benchmarks/results/spec_decode_h200_replay_1000.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_info import environment  # noqa: E402
from scripts.spec_code_workload import code_workload  # noqa: E402
from scripts.spec_step_cost import StepCost, StepLog, set_speculation, spec_counts  # noqa: E402


def _generate(llm, prompts, out_len):
    """All prompts at once, greedy: (seconds, output tokens, median over requests of its mean ITL, outputs)."""
    from shared_engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
    started = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    itl = [(o.metrics.last_token_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1) for o in outs]
    return elapsed, tokens, sorted(itl)[len(itl) // 2], [o.outputs[0].token_ids for o in outs]


def _generate_runs(llm, prompts, out_len, one_at_a_time: bool):
    """`_generate` of all prompts at once, or (`one_at_a_time`: batch 1 over several prompts) of each prompt
    alone in turn: summed seconds and tokens, the median over requests of each one's mean ITL, the outputs."""
    if not one_at_a_time:
        return _generate(llm, prompts, out_len)
    seconds = tokens = 0
    itls, outs = [], []
    for prompt in prompts:
        s, t, itl, out = _generate(llm, [prompt], out_len)
        seconds, tokens = seconds + s, tokens + t
        itls.append(itl)
        outs += out
    itls.sort()
    mid = len(itls) // 2
    return seconds, tokens, (itls[mid] if len(itls) % 2 else (itls[mid - 1] + itls[mid]) / 2), outs


def draft_cost_replay(spec):
    """BENCHMARK ONLY: a replay proposer that first runs the engine's draft model proposer (its forwards are
    paid for, its drafts discarded)."""
    from shared_engine.spec_decode.replay_proposer import ReplayProposer

    class DraftCostReplayProposer(ReplayProposer):
        def __init__(self, config, draft) -> None:
            super().__init__(config)
            self.draft = draft

        def propose(self, requests, caps):
            self.draft.propose(requests, caps)
            return super().propose(requests, caps)

    return DraftCostReplayProposer(spec.config, spec.proposer)


def _spec_run(llm, engine, spec, base, prompts, truth, out_len, k, policy, rate, seed=0,
              one_at_a_time=False) -> dict:
    """One timed run with speculation on (`policy`, at most k drafts, replay marks at `rate`)."""
    from shared_engine.spec_decode.policy import make_policy

    spec.proposer.acceptance_rate = rate
    spec.proposer.reseed(seed)
    fresh = make_policy(dataclasses.replace(base, num_speculative_tokens=k, policy=policy))
    fresh.padding = spec.policy.padding  # how the engine's graphs run speculative steps (SpecDecoder.set_step_padding)
    spec.policy = fresh
    steps = StepLog(spec)
    before = spec_counts(engine)
    first_before = list(engine.stats.spec.accepted_per_pos_total[:1]) or [0]
    cost = StepCost(engine)
    seconds, tokens, itl, outs = _generate_runs(llm, prompts, out_len, one_at_a_time)
    cost = cost.report()
    StepLog.remove(spec)
    drafts, drafted, accepted = (x - y for x, y in zip(spec_counts(engine), before))
    first = (engine.stats.spec.accepted_per_pos_total[:1] or [0])[0] - first_before[0]
    row = {"policy": policy, "k": k, "draft_token_probability": rate, "seconds": seconds,
           "tokens_per_s": tokens / seconds, "median_itl_ms": 1e3 * itl,
           # vLLM's draft acceptance rate (accepted / drafted); i.i.d. at a with full drafts: (a + ... + a^k) / k
           "acceptance_rate": accepted / max(drafted, 1),
           "first_position_acceptance": first / max(drafts, 1),  # estimates the set probability a itself
           "mean_acceptance_length": 1 + accepted / max(drafts, 1), "num_draft_tokens": drafted,
           "steps": steps.steps, "share_of_steps_speculating": steps.spec_steps / max(steps.steps, 1),
           "mean_draft_length": drafted / max(drafts, 1),
           # the i.i.d. model's accepted + bonus tokens per step with full drafts: (1 - a^(k+1)) / (1 - a)
           "expected_mean_acceptance_length": sum(rate ** i for i in range(k + 1)),
           "ms_per_step": 1e3 * seconds / max(steps.steps, 1),
           "propose_ms_per_step": 1e3 * steps.propose_seconds / max(steps.steps, 1), **cost,
           # forced acceptance emits the recording after the prefill's own first token
           "outputs_follow_recording": sum(o[1:] == t[1:] for o, t in zip(outs, truth)) / len(truth)}
    if policy == "auto":
        row["policy_fit"] = dict(zip(("c0_s", "c1_s_per_non_draft_token", "c2_s_per_spec_step", "c3_s_per_draft_token"),
                                     spec.policy.step_time() or ()))
    return row


def _calibration(llm, engine, spec, base, prompts, truth, args) -> dict:
    """Step costs for the simulator's prediction (scripts/spec_sim_predict.py): --calibration-len tokens of
    `prompts` (prefix-cached) with speculation off ("off": its `StepCost` report), then with the policy
    `always` at each k ("always": `_spec_run` rows) at --throughput-acceptance."""
    set_speculation(engine, spec, False, reset_prefix_cache=False)
    off = StepCost(engine)
    _generate(llm, prompts, args.calibration_len)
    off = off.report()
    set_speculation(engine, spec, True, reset_prefix_cache=False)
    always = [_spec_run(llm, engine, spec, base, prompts, truth, args.calibration_len, k, "always",
                        args.throughput_acceptance) for k in args.ks]
    return {"batch": len(prompts), "output_len": args.calibration_len, "off": off, "always": always}


def replay_workload(args, save) -> dict:
    """Batch 1 and each of --batch-sizes: a recording run (speculation off, cold prefix cache; its greedy
    outputs become the replay's continuations), a timed run with speculation off, then one per k with the
    policy `always` (and per --acceptance at batch 1) and one per k with the policy `auto`, on the same prompts
    (so every timed run reads the prompts from the prefix cache alike)."""
    from shared_engine import LLM

    method = {"method": "draft_model", "model": args.draft_model} if args.draft_model else {"method": "replay"}
    batches = [b for b in args.batch_sizes if b > 0]
    memory = {} if args.gpu_memory_utilization is None else {"gpu_memory_utilization": args.gpu_memory_utilization}
    llm = LLM(args.model, load_format=args.load_format, max_model_len=args.input_len + args.output_len + 64,
              max_num_seqs=max([8, *batches]), benchmark_forced_acceptance=args.forced_acceptance, **memory,
              speculative_config={**method, "num_speculative_tokens": max(args.ks), "policy": "always"})
    engine, spec = llm.engine, llm.engine.spec
    if args.draft_model:
        spec.proposer = draft_cost_replay(spec)
    proposer = ("replay (BENCHMARK ONLY: drafts the target's recorded greedy continuation, each token right with "
                "the given probability; not a real proposer)")
    if args.forced_acceptance:
        proposer += ("; FORCED ACCEPTANCE (benchmark_forced_acceptance, BENCHMARK ONLY): verification runs in full "
                     "but accepts exactly the drafts the replay marks right and emits the recorded token after "
                     "them, since dummy bf16 logits would reject the recording almost at once")
    if args.draft_model:
        proposer += (f"; every step also runs the draft model {args.draft_model} (its proposal forwards and KV "
                     "mirror), whose drafts are discarded: the cost of that draft model at the set acceptance")
    results = {"batch1": [], "throughput": []}
    body = {"workload": "random token prompts, greedy, ignore_eos", "input_len": args.input_len,
            "output_len": args.output_len, "proposer": proposer, "forced_acceptance": args.forced_acceptance,
            "engine_config": engine.config.to_flat(), "results": results}
    rng = random.Random(0)
    base = engine.config.speculative_config
    warm = [[rng.randint(100, 10000) for _ in range(16)] for _ in range(4)]  # warm-up: no run below JIT-compiles
    set_speculation(engine, spec, False)
    _, _, _, warm_truth = _generate(llm, warm, 16)
    for p, t in zip(warm, warm_truth):
        spec.proposer.record(p, t)
    set_speculation(engine, spec, True)
    for k in args.ks:
        for batch in (1, len(warm)):
            _spec_run(llm, engine, spec, base, warm[:batch], warm_truth, 16, k, "always", 0.5)
    batch1_calibration = None
    for batch in ([1] if args.batch1_prompts > 0 else []) + batches:
        # batch 1: --batch1-prompts requests, each alone in turn (more verify steps per figure: at 128 output
        # tokens one request has ~40 speculative steps, whose realised acceptance scatters around the set one)
        alone = batch == 1 and args.batch1_prompts > 1
        count = args.batch1_prompts if batch == 1 else batch
        prompts = [[rng.randint(100, 10000) for _ in range(args.input_len)] for _ in range(count)]
        set_speculation(engine, spec, False, reset_prefix_cache=False)
        if args.time_recording:  # the prompts' KV cached by a 2-token pass; the timed off run is the recording
            _generate_runs(llm, prompts, 2, alone)
        else:  # recording, and the prompts' KV cached
            _, _, _, truth = _generate_runs(llm, prompts, args.output_len, alone)
        off_cost = StepCost(engine)
        off_s, tokens, off_itl, outs = _generate_runs(llm, prompts, args.output_len, alone)
        if args.time_recording:
            truth = outs
        for p, t in zip(prompts, truth):
            spec.proposer.record(p, t)
        row = {"batch": batch, "num_prompts": count, "off_tokens_per_s": tokens / off_s,
               "off_median_itl_ms": 1e3 * off_itl, "off_outputs_repeat": None if args.time_recording else outs == truth,
               "off_step_cost": off_cost.report(), "runs": []}
        set_speculation(engine, spec, True, reset_prefix_cache=False)
        rates = args.acceptance if batch == 1 else [args.throughput_acceptance]
        plan = [("always", k, a) for a in rates for k in args.ks if "always" in args.policies]
        plan += [("auto", k, args.throughput_acceptance) for k in args.ks if "auto" in args.policies]
        if args.calibration_len and batch > 1:
            if batch1_calibration is None:
                batch1_calibration = _calibration(llm, engine, spec, base, prompts[:1], truth[:1], args)
                body["batch1_calibration"] = batch1_calibration
            row["calibration"] = _calibration(llm, engine, spec, base, prompts, truth, args)
            from scripts.spec_sim_predict import predict

            # computed here, before the runs it predicts (from off steps and the calibration's steps only)
            row["prediction"] = predict(batch, args.output_len, row, row["calibration"], batch1_calibration,
                                        sorted({pol for pol, _, _ in plan}), args.ks, args.throughput_acceptance)
            print(json.dumps({"batch": batch, "predicted": {key: round(v["throughput_ratio"], 4)
                                                            for key, v in row["prediction"].items()
                                                            if key != "costs"}}), flush=True)
        for policy, k, a in plan:
            run = _spec_run(llm, engine, spec, base, prompts, truth, args.output_len, k, policy, a,
                            one_at_a_time=alone)
            run["speedup_itl"] = off_itl / (run["median_itl_ms"] / 1e3)
            run["throughput_ratio"] = run["tokens_per_s"] / row["off_tokens_per_s"]
            predicted = row.get("prediction", {}).get(f"{policy}/k{k}")
            if predicted is not None and a == args.throughput_acceptance:
                run["predicted_throughput_ratio"] = predicted["throughput_ratio"]
                run["prediction_relative_error"] = predicted["throughput_ratio"] / run["throughput_ratio"] - 1
            row["runs"].append(run)
            print(json.dumps({"batch": batch, **{key: (round(v, 4) if isinstance(v, float) else v)
                                                for key, v in run.items() if key != "policy_fit"}}),
                  flush=True)
        results["batch1" if batch == 1 else "throughput"].append(row)
        save(body, complete=False)  # a run cut by its timeout keeps the batches it finished
    return body


def print_summary(body: dict) -> None:
    """One line per batch: speculation off, then each run's ITL speed-up and throughput ratio."""
    for row in body["results"]["batch1"] + body["results"]["throughput"]:
        runs = "  ".join(f"{r['policy']}/k{r['k']}/a{r['draft_token_probability']}: itl x{r['speedup_itl']:.2f} "
                         f"tput x{r['throughput_ratio']:.3f} spec {r['share_of_steps_speculating']:.0%} "
                         f"{r['ms_per_step']:.2f} ms/step (GPU {r['gpu_span_ms_per_step']:.2f}) "
                         + (f"sim x{r['predicted_throughput_ratio']:.3f} ({r['prediction_relative_error']:+.1%}) "
                            if "predicted_throughput_ratio" in r else "") +
                         f"L {r['mean_acceptance_length']:.2f}"
                         f"/{r['expected_mean_acceptance_length']:.2f}"
                         for r in row["runs"])
        off = row.get("off_step_cost", {})
        print(f"batch {row['batch']}: off itl {row['off_median_itl_ms']:.2f} ms {row['off_tokens_per_s']:.0f} tok/s"
              f" (GPU {off.get('gpu_span_ms_per_step', 0.0):.2f} ms/step)"
              f"  {runs}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["code", "replay"], required=True)
    p.add_argument("--model", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--methods", nargs="+", default=["ngram", "suffix"], choices=["ngram", "suffix", "draft_model"])
    p.add_argument("--draft-layers", type=int, nargs="+", default=[6],
                   help="draft_model: one run per value, the default model's first N layers (0: itself)")
    p.add_argument("--draft-model", default=None, help="replay: also run this draft model every step (its cost)")
    p.add_argument("--ks", type=int, nargs="+", default=[3, 5])
    p.add_argument("--acceptance", type=float, nargs="+", default=[0.6, 0.8])
    p.add_argument("--throughput-acceptance", type=float, default=0.8)
    p.add_argument("--batch1-prompts", type=int, default=1,
                   help="replay: batch-1 figures over this many requests, each alone in turn (0: no batch-1 runs)")
    p.add_argument("--policies", nargs="+", default=["always", "auto"], choices=["always", "auto"],
                   help="replay: the speculation policies timed at full length (speculation off always is)")
    p.add_argument("--calibration-len", type=int, default=0,
                   help="replay: per batch > 1, short off + always runs of this many output tokens (and once at "
                        "batch 1) whose step costs calibrate the simulator's predicted throughput ratio per "
                        "policy and k, computed before the timed policy runs (0: no prediction)")
    p.add_argument("--time-recording", action="store_true",
                   help="replay: no separate recording run: a 2-token pass caches the prompts and the timed off "
                        "run's outputs are the recording (one full-length run per batch fewer)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256, 448])
    p.add_argument("--forced-acceptance", action=argparse.BooleanOptionalAction, default=True,
                   help="replay: BENCHMARK-ONLY forced acceptance (the replay's marks decide verification)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="replay: the engine's setting (default the engine's); 448 requests of 2000 tokens of "
                        "llama-3.1-8b need ~117 GB of KV")
    p.add_argument("--input-len", type=int, default=1000)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--file-chars", type=int, default=1500)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    started = time.time()

    def save(body: dict, complete: bool) -> None:
        results = {"benchmark": f"spec_decode_{args.workload}", **environment(), "command": " ".join(sys.argv),
                   "model": args.model or "SmolLM2-135M-Instruct (default)", "load_format": args.load_format,
                   "wall_seconds": time.time() - started, "complete": complete, **body}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=str))

    if args.workload == "code":
        save(code_workload(args), complete=True)
    else:
        body = replay_workload(args, save)
        save(body, complete=True)
        print_summary(body)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

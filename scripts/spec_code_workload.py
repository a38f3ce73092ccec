"""The CPU code-editing workload of scripts/bench_spec_decode.py (`--workload code`): a file of this repository
in the prompt, a request to return it with one rename; each configured method (ngram, suffix, draft_model of
the default model or its first layers) at batch 1 against speculation off in the same engine, greedy outputs
asserted equal. Returns the results section (per method: seconds, ms per token, speed-up, acceptance)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from scripts.spec_step_cost import set_speculation, spec_counts

REPO = Path(__file__).resolve().parents[1]
EDITS = [("shared_engine/core/block_hash.py", "hash_block", "chain_hash"),
         ("shared_engine/config/validation.py", "check_range", "require_range"),
         ("shared_engine/sampling/penalties.py", "apply_penalties", "penalise"),
         ("kernels/silu_and_mul.py", "silu_and_mul", "swiglu")]


def code_prompts(chars: int) -> list[str]:
    prompts = []
    for path, old, new in EDITS:
        text = (REPO / path).read_text()[:chars]
        prompts.append(f"<|im_start|>user\nHere is a Python file:\n```python\n{text}\n```\nReturn the whole file "
                       f"unchanged except that `{old}` is renamed to `{new}`.<|im_end|>\n<|im_start|>assistant\n"
                       f"```python\n")
    return prompts


def timed_requests(llm, prompts, params) -> tuple[float, int, list]:
    """Each prompt alone (batch 1): seconds, output tokens, outputs."""
    seconds, tokens, outs = 0.0, 0, []
    for prompt in prompts:
        started = time.perf_counter()
        out = llm.generate(prompt, params, use_tqdm=False)[0]
        seconds += time.perf_counter() - started
        tokens += len(out.outputs[0].token_ids)
        outs.append(out.outputs[0].token_ids)
    return seconds, tokens, outs


def draft_model_dir(num_layers: int) -> str:
    """The draft for `draft_model`: the default model's first `num_layers` layers (0: the model itself)."""
    import tempfile

    from shared_engine.model_loader.default_model import default_model_dir
    from shared_engine.model_loader.layer_subset import write_layer_subset

    if num_layers == 0:
        return str(default_model_dir())
    target = Path(tempfile.mkdtemp(prefix="draft-layers-"))
    return str(write_layer_subset(default_model_dir(), target, num_layers))


def code_runs(args) -> list[tuple[str, dict, int | None]]:
    """(row name, extra speculative_config, draft layers) per benchmarked configuration."""
    runs = []
    for method in args.methods:
        if method != "draft_model":
            runs.append((method, {}, None))
            continue
        for layers in args.draft_layers:
            name = "draft_model_self" if layers == 0 else f"draft_model_{layers}_layers"
            runs.append((name, {"model": draft_model_dir(layers)}, layers))
    return runs


def code_workload(args) -> dict:
    from shared_engine import LLM, SamplingParams

    prompts = code_prompts(args.file_chars)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len)
    runs = {}
    for name, extra, layers in code_runs(args):
        method = "draft_model" if extra else name
        llm = LLM(args.model, max_model_len=2048, speculative_config={
            "method": method, "num_speculative_tokens": args.k, "policy": "always", **extra})
        engine, spec = llm.engine, llm.engine.spec
        llm.generate("warm up", SamplingParams(max_tokens=4), use_tqdm=False)
        set_speculation(engine, spec, False)
        off_s, off_tokens, off_outs = timed_requests(llm, prompts, params)
        set_speculation(engine, spec, True)
        before = spec_counts(engine)
        on_s, on_tokens, on_outs = timed_requests(llm, prompts, params)
        drafts, drafted, accepted = (a - b for a, b in zip(spec_counts(engine), before))
        assert on_outs == off_outs, "greedy outputs must not change"
        runs[name] = {"off_seconds": off_s, "on_seconds": on_s, "output_tokens": on_tokens,
                      "off_ms_per_token": 1e3 * off_s / off_tokens, "on_ms_per_token": 1e3 * on_s / on_tokens,
                      "speedup_batch1": off_s / on_s, "acceptance_rate": accepted / max(drafted, 1),
                      "mean_acceptance_length": 1 + accepted / max(drafts, 1), "num_draft_tokens": drafted,
                      **({"draft": f"default model's first {layers} of 30 layers" if layers
                          else "the default model itself"} if layers is not None else {}),
                      "engine_config": engine.config.to_flat()}
        print(name, json.dumps({k: v for k, v in runs[name].items() if k != "engine_config"}), flush=True)
        del llm, engine, spec
    return {"workload": "code editing: a file of this repo in the prompt, return it with one rename",
            "files": [e[0] for e in EDITS], "file_chars": args.file_chars, "output_len": args.output_len,
            "k": args.k, "policy": "always", "runs": runs}

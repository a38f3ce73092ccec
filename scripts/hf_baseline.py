"""transformers' side of scripts/bench_offline.py: the same requests through `generate` (padded batches of
--hf-batch-size, left padding) or its continuous batching `generate_batch`, recording the batch each actually ran
at (`running_batch`) and, for `generate_batch`, the `ContinuousBatchingConfig` it resolved and its warm-up
(timed apart and left out of its figure, as our engine's is). See bench_offline.py's docstring for the fields."""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager


def hf_model(args, source):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    # the same device our engine picks by default: CUDA when present (never a silent CPU baseline on a GPU host)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
        args.dtype or ("bfloat16" if device == "cuda" else "float32"))
    attn = {"generate_batch": "paged|sdpa"}.get(args.hf_mode, "sdpa")
    if source.path is None:  # a shape preset: random weights of the real shapes, built on the device
        config = AutoConfig.for_model(**{k: v for k, v in source.config.items() if k != "architectures"})
        with torch.device(device):
            return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn).eval()
    return AutoModelForCausalLM.from_pretrained(source.path, dtype=dtype, attn_implementation=attn).to(device).eval()


# transformers' ContinuousBatchingConfig as generate_batch resolved it (num_blocks and max_batch_tokens once its
# paged cache was sized): these, not --hf-batch-size (which generate_batch never sees), bound its batch
CB_CONFIG_FIELDS = ("page_size", "num_blocks", "max_batch_tokens", "max_requests_per_batch", "max_blocks_per_request",
                    "max_memory_percent", "scheduler_type", "use_async_batching", "use_cuda_graph",
                    "allow_block_sharing")


@contextmanager
def recording_generate_batch(record: dict):
    """While open, transformers' continuous batching reports what it ran: the `ContinuousBatchingConfig` it
    resolved once its paged cache was sized (`record["config"]`), the seconds of its warm-up (`record["warmup_s"]`:
    sizing and allocating the paged cache, CUDA graph capture; `generate_batch` runs it inside the call, where
    ours warms up before its timed run), and per forward step the requests its scheduler put in the batch, those
    with one query token (decodes) and the query tokens (`record["steps"]`)."""
    from transformers.generation.continuous_batching import continuous_api, scheduler

    manager_cls = continuous_api.ContinuousBatchingManager
    create, warmup = manager_cls._create_batch_processor, manager_cls.warmup

    def timed_warmup(self):
        started = time.perf_counter()
        warmup(self)
        record["warmup_s"] = record.get("warmup_s", 0.0) + time.perf_counter() - started

    def create_and_record(self):
        processor = create(self)
        config = self.continuous_batching_config
        record["config"] = {k: list(v) if isinstance(v, tuple) else v for k in CB_CONFIG_FIELDS
                            if (v := getattr(config, k, None)) is None or isinstance(v, (int, float, str, bool, tuple))}
        return processor

    originals = {cls: cls.schedule_batch for cls in set(scheduler.SCHEDULER_MAPPING.values())}

    def recorded(original):
        def schedule_batch(self, token_budget, cache_budget):
            batch = original(self, token_budget, cache_budget)
            if batch[0]:  # a forward step (None: cache full, retried; []: nothing left)
                requests = batch[0]
                record["steps"].append((len(requests), sum(1 for r in requests if r.query_length == 1), batch[2]))
            return batch
        return schedule_batch

    record.setdefault("steps", [])
    manager_cls._create_batch_processor, manager_cls.warmup = create_and_record, timed_warmup
    for cls, original in originals.items():
        cls.schedule_batch = recorded(original)
    try:
        yield record
    finally:
        manager_cls._create_batch_processor, manager_cls.warmup = create, warmup
        for cls, original in originals.items():
            cls.schedule_batch = original


def generate_batch_running_batch(record: dict) -> dict:
    steps = record.get("steps", [])
    decode_steps = [d for _, d, _ in steps if d]
    return {"steps": len(steps),
            "max_requests_per_step": max((n for n, _, _ in steps), default=0),
            "mean_requests_per_step": statistics.mean(n for n, _, _ in steps) if steps else 0.0,
            "decode_steps": len(decode_steps), "max_decode_requests": max(decode_steps, default=0),
            "mean_decode_requests": statistics.mean(decode_steps) if decode_steps else 0.0,
            "max_query_tokens_per_step": max((q for _, _, q in steps), default=0),
            "continuous_batching_config": record.get("config")}


def run_transformers(args, prompts, out_lens, source) -> dict:
    """transformers on these requests (main passes the first `--hf-num-requests`, all by default)."""
    import torch

    model = hf_model(args, source)
    count = len(prompts)
    started = time.perf_counter()
    if args.hf_mode == "generate_batch":
        from transformers.generation import ContinuousBatchingConfig, GenerationConfig

        config = GenerationConfig(max_new_tokens=max(out_lens), do_sample=False, eos_token_id=None, pad_token_id=0)
        # None: transformers' own defaults (sized from free memory); the resolved values are recorded either way
        cb_config = ContinuousBatchingConfig(num_blocks=args.hf_num_blocks, max_batch_tokens=args.hf_max_batch_tokens)
        with recording_generate_batch({}) as record:
            results = model.generate_batch(inputs=prompts, generation_config=config,
                                           continuous_batching_config=cb_config, progress_bar=False)
        # its warm-up is outside the figure, as our engine's (before its timed run) is; both are recorded
        warmup_s = record.get("warmup_s", 0.0)
        timing = {"elapsed_including_warmup_s": time.perf_counter() - started, "warmup_s": warmup_s}
        elapsed = timing["elapsed_including_warmup_s"] - warmup_s
        generated = sum(len(r.generated_tokens) for r in results.values())
        useful = sum(min(len(r.generated_tokens), n) for r, n in zip(results.values(), out_lens))
        running = generate_batch_running_batch(record)
    else:
        rows = decode_steps = 0
        for i in range(0, len(prompts), args.hf_batch_size):
            batch, lens = prompts[i : i + args.hf_batch_size], out_lens[i : i + args.hf_batch_size]
            width = max(map(len, batch))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=model.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(lens),
                               min_new_tokens=max(lens), do_sample=False, pad_token_id=0)
            rows, decode_steps = rows + len(batch) * max(lens), decode_steps + max(lens)
        elapsed = time.perf_counter() - started
        timing = {}
        useful = sum(out_lens)
        generated = rows  # every row of a padded batch decodes until the batch's longest request
        num_batches = -(-len(prompts) // args.hf_batch_size)
        running = {"padded_batch_size": args.hf_batch_size, "batches": num_batches,
                 "max_rows_per_step": min(args.hf_batch_size, len(prompts)),
                 "mean_rows_per_step": rows / decode_steps if decode_steps else 0.0}
    return {"mode": args.hf_mode, "device": str(model.device), "dtype": str(model.dtype), "num_requests": count,
            "requests": f"the first {count} of the workload's {args.num_requests}",
            "elapsed_s": elapsed, **timing, "output_tokens": useful, "generated_tokens": generated,
            "output_throughput": useful / elapsed, "running_batch": running,
            "attn_implementation": model.config._attn_implementation}

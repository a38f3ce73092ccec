"""`run_batch`: an OpenAI batch file through the offline engine (no HTTP anywhere on the path).

For throughput, not latency:
- every row is queued at once (MLPerf's offline scenario), longest prompt first (largest-first packing:
  the long tail of a heavy-tailed length distribution starts early instead of finishing last, alone);
- the prompt prefix that all rows share (the batch's one instruction: the longest common prefix of the
  rendered prompts, whole KV blocks only) is prefilled once, by a one-token request ahead of the rows,
  so every row then hits it in the prefix cache; otherwise the first step's many prefills would each
  compute it, none finding it cached yet;
- a tqdm bar shows tickets/s and the ETA (`--disable-progress-bar` turns it off).

Output rows come back in input order (batch_output.py for the shape); the file appears atomically.
`BatchSummary` (counts, tokens, seconds, prefix hit rate) is returned (the CLI, cli_args.py, logs it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from shared_engine.entrypoints.batch.batch_input import BatchRow, encode_rows, prepare, read_rows
from shared_engine.entrypoints.batch.batch_output import error_row, success_row, write_jsonl_atomic
from shared_engine.entrypoints.openai.errors import APIError
from shared_engine.entrypoints.openai.request_limits import check_prompt_tokens
from shared_engine.entrypoints.openai.server_config import ServerConfig
from shared_engine.sampling_params import SamplingParams

logger = logging.getLogger("shared_engine.batch")


@dataclass(frozen=True)
class BatchSummary:
    """Counts in rows, tokens in tokens, times in seconds. `prompt_tokens` counts every row's prompt,
    `prefill_tokens` the prompt tokens the engine computed (the rest were prefix-cache hits). `elapsed_s`
    runs from the first queued request to the written file; `prepare_s` (reading, validation, chat
    templates, tokenisation) comes before it."""

    num_rows: int
    num_succeeded: int
    num_failed: int
    prompt_tokens: int
    prefill_tokens: int
    cached_prompt_tokens: int
    completion_tokens: int
    shared_prefix_tokens: int
    elapsed_s: float
    prefix_cache_hit_rate: float
    prepare_s: float = 0.0

    @property
    def rows_per_s(self) -> float:
        return self.num_rows / self.elapsed_s if self.elapsed_s else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        s = self.elapsed_s or float("inf")
        d.update(rows_per_s=self.rows_per_s, output_tokens_per_s=self.completion_tokens / s,
                 prompt_tokens_per_s=self.prompt_tokens / s, prefill_tokens_per_s=self.prefill_tokens / s)
        return d


def shared_prefix(rows: list[BatchRow], block_size: int) -> list[int]:
    """The longest token prefix common to every runnable row, cut to whole blocks (only full blocks are
    cached); [] for fewer than two rows."""
    prompts = [r.prompt_token_ids for r in rows]
    if len(prompts) < 2:
        return []
    first, n = prompts[0], min(map(len, prompts))
    for p in prompts[1:]:
        i = 0
        while i < n and p[i] == first[i]:
            i += 1
        n = i
    # keep at least one token of every prompt uncached (the engine must compute the last one)
    n = min(n, min(map(len, prompts)) - 1)
    return first[: (n // block_size) * block_size]


def run_batch(llm, input_path: Path, output_path: Path, model_name: str, use_tqdm: bool = True,
              server_config=None, progress=None) -> BatchSummary:
    """Run every row of `input_path` through `llm` (a `shared_engine.LLM`) and write `output_path`.

    `server_config` (a `ServerConfig`; default: the defaults) bounds `n`, stop lists and prompt tokens per
    request (`max_prompt_tokens_per_request`, prompt x n) as the server's chat endpoint does.
    `progress(rows_done, completion_tokens, seconds_since_first_queued)`, if given, is called after every engine
    step (a load test's partial results when its time runs out).
    Raises `DuplicateCustomIdError` before anything runs; any other per-row problem is that row's error."""
    from shared_engine.entrypoints.openai.logprobs import TokenText

    engine = llm.engine
    t0 = time.perf_counter()
    rows = read_rows(Path(input_path))
    for row in rows:
        prepare(row, engine.tokenizer, model_name, server_config)
    encode_rows(rows, engine.tokenizer)
    limits = server_config or ServerConfig()
    for row in rows:
        if row.error is None:
            try:  # the server's per-request prompt-token limit, as /v1/chat/completions applies it
                check_prompt_tokens(limits, [len(row.prompt_token_ids)], row.params.n, "messages")
                engine_check(engine, row.prompt_token_ids, row.params)
            except APIError as e:
                row.error = e
            except ValueError as e:
                row.error = APIError(400, str(e), "messages")
    runnable = [r for r in rows if r.error is None]
    started = time.perf_counter()
    prepare_s = started - t0
    sched, stats = engine.scheduler, engine.stats
    queries0, hits0, prefill0 = sched.prefix_cache_queries, sched.prefix_cache_hits, stats.num_prompt_tokens_total
    prefix = shared_prefix(runnable, engine.config.cache.block_size) if engine.config.cache.enable_prefix_caching \
        else []
    if prefix:
        llm.generate([prefix], SamplingParams(max_tokens=1), use_tqdm=False)
    outputs = _generate(engine, runnable, use_tqdm, progress, started)
    runnable = [r for r in runnable if r.error is None]  # add_request may refuse a row (a response_format)
    token_text = TokenText(engine.tokenizer) if engine.tokenizer is not None else None
    out_rows = [error_row(r.custom_id, r.error) if r.error is not None
                else success_row(r.custom_id, outputs[r.line], model_name, token_text, r.top_logprobs) for r in rows]
    elapsed = time.perf_counter() - started
    write_jsonl_atomic(Path(output_path), out_rows)
    queries, hits = sched.prefix_cache_queries - queries0, sched.prefix_cache_hits - hits0
    done = [outputs[r.line] for r in runnable]
    return BatchSummary(
        num_rows=len(rows), num_succeeded=len(runnable), num_failed=len(rows) - len(runnable),
        prompt_tokens=sum(len(o.prompt_token_ids) for o in done),
        prefill_tokens=stats.num_prompt_tokens_total - prefill0,
        cached_prompt_tokens=sum(o.num_cached_tokens for o in done),
        completion_tokens=sum(len(c.token_ids) for o in done for c in o.outputs),
        shared_prefix_tokens=len(prefix), elapsed_s=elapsed,
        prefix_cache_hit_rate=hits / queries if queries else 0.0, prepare_s=prepare_s)


def engine_check(engine, ids, params) -> None:
    from shared_engine.entrypoints.llm import engine_check as check

    check(engine, ids, params)


def _generate(engine, rows: list[BatchRow], use_tqdm: bool, progress=None, started: float = 0.0) -> dict:
    """Queue every row, longest prompt first; returns {row.line: RequestOutput}."""
    ordered = sorted(rows, key=lambda r: len(r.prompt_token_ids), reverse=True)
    for r in ordered:
        try:
            engine.add_request(f"batch-{r.line}", r.prompt_token_ids, r.params, final_only=True)
        except ValueError as e:
            r.error = APIError(400, str(e))
    rows = [r for r in rows if r.error is None]
    bar = None
    if use_tqdm and rows:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(rows), desc="Processed tickets", unit="ticket", dynamic_ncols=True, smoothing=0.1)
    results, generated, last = {}, 0, time.perf_counter()
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished and output.request_id.startswith("batch-"):
                results[int(output.request_id.removeprefix("batch-"))] = output
                generated += sum(len(c.token_ids) for c in output.outputs)
                if bar is not None:
                    bar.update(1)
        if progress is not None:
            progress(len(results), generated, time.perf_counter() - started)
        if bar is not None and time.perf_counter() - last > 1.0:
            last = time.perf_counter()
            bar.set_postfix_str(f"{generated / max(bar.format_dict['elapsed'], 1e-9):.0f} output tok/s", refresh=False)
    if bar is not None:
        bar.close()
    return results

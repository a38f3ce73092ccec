"""`python -m shared_engine run-batch -i IN.jsonl -o OUT.jsonl [MODEL] [--config FILE.yaml] [engine flags]`
(vLLM's `run-batch` shape). Imports nothing heavy until the command runs, so `--help` stays fast."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

logger = logging.getLogger("shared_engine.batch")


def add_run_batch_arguments(parser: argparse.ArgumentParser) -> None:
    from shared_engine.entrypoints.openai.cli_args import add_serve_arguments

    parser.add_argument("-i", "--input-file", type=Path, required=True, help="OpenAI batch input (JSONL)")
    parser.add_argument("-o", "--output-file", type=Path, required=True,
                        help="OpenAI batch output (JSONL), written atomically (temp file + rename)")
    parser.add_argument("--summary-json", type=Path, default=None, help="also write the run's summary here")
    parser.add_argument("--disable-progress-bar", action="store_true")
    add_serve_arguments(parser)


def main(args: argparse.Namespace) -> int:
    """The `run-batch` command: 0 on success (rows may still carry errors), 2 for a refused input."""
    from shared_engine.entrypoints.batch.batch_input import DuplicateCustomIdError, read_rows
    from shared_engine.entrypoints.batch.run_batch import run_batch
    from shared_engine.entrypoints.llm import LLM
    from shared_engine.entrypoints.openai.cli_args import build_configs

    skip = ("input_file", "output_file", "summary_json", "disable_progress_bar")
    engine_config, server_config = build_configs(argparse.Namespace(
        **{k: v for k, v in vars(args).items() if k not in skip}))
    try:
        read_rows(args.input_file)  # refuse duplicates before paying for the model load
    except (DuplicateCustomIdError, OSError) as e:
        logger.error("%s", e)
        return 2
    llm = LLM.from_config(engine_config)
    name = engine_config.model.served_model_name or llm.engine.source.name
    summary = run_batch(llm, args.input_file, args.output_file, name, not args.disable_progress_bar,
                        server_config)
    d = summary.as_dict()
    logger.info("run-batch: %d rows (%d failed) in %.1f s: %.2f rows/s, %.0f output tok/s, %.0f prompt tok/s, "
                "prefix cache hit rate %.1f%%", d["num_rows"], d["num_failed"], d["elapsed_s"], d["rows_per_s"],
                d["output_tokens_per_s"], d["prompt_tokens_per_s"], 100 * d["prefix_cache_hit_rate"])
    if args.summary_json:
        args.summary_json.write_text(json.dumps(d, indent=2))
    return 0

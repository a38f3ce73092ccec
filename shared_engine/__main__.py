"""`python -m shared_engine <command>` (also the `shared-engine` console script).

Commands: `prepare-model` (convert the embedded default model once and print its directory);
`serve [MODEL] [--config FILE.yaml] [flags]` (the OpenAI-compatible server; needs the `server` extra);
`run-batch -i IN.jsonl -o OUT.jsonl [MODEL] [--config FILE.yaml] [flags]` (an OpenAI batch file through the
offline engine, vLLM's shape; needs the `server` extra for the request and response models).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shared-engine", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare-model", help="convert the embedded default model (SmolLM2-135M-Instruct) once")
    from shared_engine.entrypoints.openai.cli_args import add_serve_arguments, build_configs

    add_serve_arguments(sub.add_parser("serve", help="run the OpenAI-compatible HTTP server"))
    from shared_engine.entrypoints.batch.cli_args import add_run_batch_arguments

    add_run_batch_arguments(sub.add_parser("run-batch", help="run an OpenAI batch file (JSONL) through the "
                                           "offline engine: -i IN.jsonl -o OUT.jsonl"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    if args.command == "prepare-model":
        from shared_engine.model_loader.default_model import default_model_dir

        print(default_model_dir())
    elif args.command == "serve":
        # Idle OpenMP threads sleep instead of spinning (libgomp reads this when torch loads it, in this
        # process and in the engine core it spawns): spinning threads steal the cores that the event loop,
        # the tokenizer and any other process need (benchmarks/cpu_contention.py). Set it to override.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            engine_config, server_config = build_configs(args)
        except (ValueError, OSError) as e:
            parser.error(str(e))
        from shared_engine.entrypoints.openai.api_server import run_server

        run_server(engine_config, server_config)
    elif args.command == "run-batch":
        from shared_engine.entrypoints.batch.cli_args import main as run_batch_main

        return run_batch_main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

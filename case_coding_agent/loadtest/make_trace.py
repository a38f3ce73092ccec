"""Write a profile's session trace (Mooncake format) and its prompt texts.

    python -m case_coding_agent.loadtest.make_trace --profile cpu    # traces/cpu/{trace,prompts}.jsonl
    python -m case_coding_agent.loadtest.make_trace --profile h200   # traces/h200/trace.jsonl (+ prompts,
                                                                     #  not committed: ~4 MB, regenerated)

The tokenizer is the default model's (SmolLM2-135M-Instruct; `python -m shared_engine prepare-model`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from case_coding_agent.loadtest.session_gen import CASE_DIR, SessionGenerator, load_profile
from case_coding_agent.loadtest.trace import write_trace

TRACES = CASE_DIR / "loadtest" / "traces"


def default_tokenizer():
    from tokenizers import Tokenizer

    from shared_engine.model_loader.default_model import default_model_dir

    return Tokenizer.from_file(str(default_model_dir() / "tokenizer.json"))


def commit() -> str:
    """The checkout's short commit, `-dirty` when tracked files differ from it."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=CASE_DIR)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True, cwd=CASE_DIR).stdout.strip()
    return (out.stdout.strip() or "unknown") + ("-dirty" if dirty else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out-dir", type=Path, help="default: loadtest/traces/<profile>")
    args = ap.parse_args(argv)
    profile = load_profile(args.profile)
    header, records, rows = SessionGenerator(profile, default_tokenizer()).generate()
    header |= {"command": "python -m case_coding_agent.loadtest.make_trace " + " ".join(sys.argv[1:] or argv or []),
               "commit": commit()}
    out = args.out_dir or TRACES / args.profile
    out.mkdir(parents=True, exist_ok=True)
    write_trace(out / "trace.jsonl", header, records)
    (out / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lengths = [r.input_length for r in records]
    print(f"{len(records)} requests in {header['num_sessions']} sessions, prompt tokens {min(lengths)}-"
          f"{max(lengths)} (mean {sum(lengths) / len(lengths):.0f}); wrote {out}/trace.jsonl, prompts.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())

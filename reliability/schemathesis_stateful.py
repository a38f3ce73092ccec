"""Schemathesis across the API, for the results file: the stateful phase (call sequences chained through
the schema's links, openapi_links.py) over /v1/*, /tokenize and /detokenize, then the per-operation phases
over /v1/*, against a local server on the default model (max_model_len 128: fuzzed generations stay short;
tests/server/schemathesis_hooks.py caps max_tokens at 2 and n at 1). Checks: no 5xx, no undocumented
status code or content type, every response valid against its schema.

    python -m reliability.schemathesis_stateful --append-to schemathesis_runs

The same commands as tests/server/test_schemathesis.py (which `make test` runs with 25 examples per
operation); this script records their counts (scenarios, links followed, calls generated, failures) with
the machine, commit and command. Bounded: each schemathesis run at most `--timeout-s`.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOOKS_DIR = REPO / "tests" / "server"
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
COMMON = ["--checks", CHECKS, "--seed", "1", "--request-timeout", "60", "--generation-database", "none",
          "--workers", "1"]


def _schemathesis() -> str:
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if exe is None:
        raise SystemExit("schemathesis is not installed (pip install -e '.[server,test]')")
    return exe


def _count(pattern: str, text: str) -> int | None:
    found = re.search(pattern, text)
    return int(found.group(1)) if found else None


def run_phase(url: str, phase: str, max_examples: int, timeout_s: float) -> dict:
    """One schemathesis run; its exit code, counts parsed from its summary and the summary's last lines."""
    paths = "^/(v1/|tokenize$|detokenize$)" if phase == "stateful" else "^/v1/"
    phases = "stateful" if phase == "stateful" else "examples,fuzzing"
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": f"{HOOKS_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [_schemathesis(), "--no-color", "run", url + "/openapi.json", "--include-path-regex", paths,
           "--phases", phases, "--max-examples", str(max_examples), *COMMON]
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
    out = proc.stdout + proc.stderr
    links = re.search(r"API Links:\s+(\d+) covered / (\d+) selected", out)
    return {"exit_code": proc.returncode, "seconds": round(time.monotonic() - start, 1),
            "command": " ".join(["schemathesis", *cmd[1:]]).replace(url, "URL"),
            "max_examples": max_examples, "scenarios": _count(r"Scenarios:\s+(\d+)", out),
            "generated_calls": _count(r"(\d+) generated", out),
            "links_covered": int(links.group(1)) if links else None,
            "links_selected": int(links.group(2)) if links else None,
            "server_errors_5xx": len(re.findall(r"Server error", out)),
            "summary_tail": [line for line in out.splitlines()[-30:] if line.strip()]}


def main(argv: list[str] | None = None) -> int:
    from reliability.local_server import local_server
    from reliability.results import RESULTS, add_append_argument, save

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a running server (default: start one on the default model)")
    p.add_argument("--stateful-examples", type=int, default=30)
    p.add_argument("--operation-examples", type=int, default=50)
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--out", type=Path, default=RESULTS)
    add_append_argument(p, "schemathesis")
    args = p.parse_args(argv)
    flags = ["--max-model-len", "128"]
    with local_server(flags, url=args.url) as url:
        stateful = run_phase(url, "stateful", args.stateful_examples, args.timeout_s)
        per_operation = run_phase(url, "per_operation", args.operation_examples, args.timeout_s)
    section = {"config": {"server": "python -m shared_engine serve " + " ".join(flags), "checks": CHECKS,
                          "hooks": "tests/server/schemathesis_hooks.py (max_tokens <= 2, n <= 1)"},
               "stateful": stateful, "per_operation": per_operation}
    save("schemathesis", section, args.out, args.append_to)
    for name, run in (("stateful", stateful), ("per_operation", per_operation)):
        print(name, {k: v for k, v in run.items() if k != "summary_tail"})
    return 0 if stateful["exit_code"] == 0 and per_operation["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

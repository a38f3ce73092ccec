"""schemathesis against `/openapi.json`: per operation for the `/v1` routes (at least EXAMPLES each, 25 by default), and
stateful (call sequences chained through the schema's links) across /v1, /tokenize and /detokenize; no 5xx,
no undocumented status, content type or response-schema violation."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent
# examples per operation: 25 in `make test`; SCHEMATHESIS_MAX_EXAMPLES=50 (or more) for a longer run
EXAMPLES = int(os.environ.get("SCHEMATHESIS_MAX_EXAMPLES", "25"))
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def test_schemathesis_v1_routes(small_server, tmp_path):
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if exe is None:
        pytest.skip("schemathesis is not installed")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [exe, "--no-color", "run", small_server.url + "/openapi.json", "--include-path-regex", "^/v1/",
           "--checks", CHECKS, "--max-examples", str(EXAMPLES), "--seed", "1", "--phases", "examples,fuzzing",
           "--request-timeout", "60", "--generation-database", "none", "--workers", "1",
           "--report", "junit", "--report-dir", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=480, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    generated = re.search(r"(\d+) generated", out)
    # EXAMPLES per operation with inputs (completions, chat); GET /v1/models has none to vary.
    assert generated and int(generated.group(1)) >= 2 * EXAMPLES, out[-3000:]
    health = small_server.get("/health")
    assert health.status_code == 200


def test_schemathesis_stateful_across_the_api(small_server, tmp_path):
    """The stateful phase: sequences of calls chained through the schema's links (openapi_links.py:
    the listed model id into every route taking `model`, /tokenize's tokens into /detokenize, a
    generation's text into /tokenize and the next completion), over /v1/*, /tokenize and /detokenize;
    no 5xx, nothing undocumented. The links must be exercised: most of them are covered."""
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if exe is None:
        pytest.skip("schemathesis is not installed")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
           "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [exe, "--no-color", "run", small_server.url + "/openapi.json",
           "--include-path-regex", "^/(v1/|tokenize$|detokenize$)", "--checks", CHECKS, "--phases", "stateful",
           "--max-examples", "30", "--seed", "1", "--request-timeout", "60", "--generation-database", "none",
           "--workers", "1", "--report", "junit", "--report-dir", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=480, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    scenarios = re.search(r"Scenarios:\s+(\d+)", out)
    links = re.search(r"API Links:\s+(\d+) covered / (\d+) selected", out)
    assert scenarios and int(scenarios.group(1)) >= 30, out[-3000:]
    # openapi_links.py's 8 (plus any schemathesis infers, e.g. /v1/models -> /v1/models/{id}); seeded runs
    # have followed 5-7 of them, the rest are left to chance
    assert links and int(links.group(2)) >= 8 and int(links.group(1)) >= 4, out[-3000:]
    assert small_server.get("/health").status_code == 200

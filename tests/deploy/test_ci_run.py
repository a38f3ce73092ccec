"""CI honesty (.ci/run): a system set-up script that fails makes the suites that need it fail, not skip,
because the variable its `# ci-require:` line names is set before the script runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run_ci(tmp_path: Path, scripts: dict[str, str]) -> subprocess.CompletedProcess:
    """.ci/run in a copy of the layout, with `scripts` as its set-up scripts and `env` as the test command."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    setup = tmp_path / "setup"
    setup.mkdir()
    for name, text in scripts.items():
        (setup / name).write_text(text)
    env = {"PATH": "/usr/bin:/bin", "CI_SETUP_DIR": str(setup), "CI_TEST_COMMAND": "env"}
    return subprocess.run(["bash", str(tmp_path / ".ci" / "run")], env=env, capture_output=True, text=True,
                          timeout=60)


def test_a_failing_set_up_still_requires_its_suites(tmp_path):
    out = _run_ci(tmp_path, {
        "setup_broken.sh": "# ci-require: X_REQUIRE_BROKEN\nexit 3\n",
        "setup_fine.sh": "# ci-require: X_REQUIRE_FINE\necho EXTRA=yes >> \"$1\"\n",
    })
    assert out.returncode == 0, out.stderr
    env = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert env["X_REQUIRE_BROKEN"] == "1" and env["X_REQUIRE_FINE"] == "1" and env["EXTRA"] == "yes"
    assert "setup_broken.sh failed" in out.stdout


def test_a_set_up_without_its_variable_is_refused(tmp_path):
    out = _run_ci(tmp_path, {"setup_silent.sh": "exit 0\n"})
    assert out.returncode != 0 and "ci-require" in out.stderr


def test_every_repository_set_up_names_a_variable_the_tests_read():
    tests_text = "\n".join(p.read_text() for p in (REPO / "tests").rglob("*.py"))
    scripts = sorted((REPO / "scripts" / "ci").glob("setup_*.sh"))
    assert scripts
    for script in scripts:
        names = re.findall(r"^# ci-require: *([A-Z0-9_]+)", script.read_text(), flags=re.M)
        assert names, f"{script.name}: no '# ci-require: VARIABLE' line"
        for name in names:
            assert f'"{name}"' in tests_text, f"{script.name}: no test reads {name}"

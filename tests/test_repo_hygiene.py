"""The tree itself: no merge-conflict markers and no large or environment files committed.

A merge that leaves `<<<<<<<` lines in a README or a module, or a virtual environment committed by mistake
(it once added 181 MiB of site-packages), passes every other test; these checks catch both from `git ls-files`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_FILE_BYTES = 2 * 1024 * 1024  # results JSON and step profiles stay near 1 MiB


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:  # an sdist without .git
        pytest.skip(f"not a git checkout: {exc}")
    return [ROOT / p for p in out.decode().split("\0") if p]


def test_no_conflict_markers():
    bad = []
    for path in _tracked():
        if not path.is_file() or path.suffix in {".png", ".gguf", ".safetensors"}:
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue
        bad += [f"{path.relative_to(ROOT)}:{i + 1}" for i, line in enumerate(lines)
                if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line == "<<<<<<<"]
    assert not bad, f"merge-conflict markers: {bad}"


def test_no_large_or_environment_files():
    tracked = _tracked()
    envs = sorted({p.relative_to(ROOT).parts[0] for p in tracked
                   if p.relative_to(ROOT).parts[0].startswith((".venv", "venv"))})
    assert not envs, f"virtual environments committed: {envs}"
    large = [f"{p.relative_to(ROOT)} ({p.stat().st_size} B)" for p in tracked
             if p.is_file() and p.stat().st_size > MAX_FILE_BYTES]
    assert not large, f"files over {MAX_FILE_BYTES} B: {large}"

"""The case's layout (case-study.md) and its README: the ten sections in order, every generated block
present and current (re-generating it from the committed results files changes nothing), and every figure
embedded exists."""

from __future__ import annotations

import re
from pathlib import Path

from case_coding_agent import report

CASE = Path(__file__).resolve().parents[2] / "case_coding_agent"
SECTIONS = ["The Brief", "Architecture", "First Attempt", "What Broke", "The Diagnosis", "The Fix",
            "The Numbers", "What Changes at 10x", "Lessons", "Cheat Sheet"]


def test_layout():
    for path in ("README.md", "config.yaml", "docker-compose.yaml", "cost_model.py", "report.py",
                 "first_attempt/config.yaml", "the_fix/config.yaml", "loadtest/locustfile.py", "k8s/base",
                 "k8s/cpu", "k8s/gpu", "plots"):
        assert (CASE / path).exists(), path
    assert (CASE / "config.yaml").read_text().split("\n", 2)[2] == (CASE / "the_fix/config.yaml").read_text().split(
        "\n", 2)[2], "config.yaml is the fix's config"


def test_readme_has_the_ten_sections_in_order():
    headings = re.findall(r"^## (.+)$", (CASE / "README.md").read_text(), re.M)
    assert headings == SECTIONS


def test_generated_blocks_are_current_and_figures_exist(tmp_path):
    text = (CASE / "README.md").read_text()
    copy = tmp_path / "README.md"
    copy.write_text(text)
    report.update_readme(copy)
    assert copy.read_text() == text, "README's generated blocks are stale: run python -m case_coding_agent.report"
    for image in re.findall(r"!\[[^]]*\]\(([^)]+)\)", text):
        assert (CASE / image).exists(), image

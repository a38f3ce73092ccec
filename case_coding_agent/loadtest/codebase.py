"""`Codebase`: this repository's own source files, the code the simulated agent reads.

Files are the tracked Python sources of the engine and its scripts (`shared_engine/`, `kernels/`, `scripts/`,
`benchmarks/`), sorted by path; this case's own folder is left out, so editing the case does not change its
workload. A read is a run of whole lines from one file, as an agent's `read_file(path, start, end)` returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("shared_engine", "kernels", "scripts", "benchmarks")


@dataclass(frozen=True)
class FileSlice:
    path: str  # relative to the repository root
    start: int  # 1-based first line
    end: int  # last line, inclusive
    text: str


class Codebase:
    def __init__(self, root: Path = REPO, roots: tuple[str, ...] = ROOTS) -> None:
        self.root = root
        self.paths = sorted(str(p.relative_to(root)) for r in roots for p in (root / r).rglob("*.py")
                            if "__pycache__" not in p.parts and p.stat().st_size > 2000)
        if not self.paths:
            raise FileNotFoundError(f"no source files under {root} ({', '.join(roots)})")
        self._lines: dict[str, list[str]] = {}

    def lines(self, path: str) -> list[str]:
        if path not in self._lines:
            self._lines[path] = (self.root / path).read_text(errors="replace").splitlines(keepends=True)
        return self._lines[path]

    def read(self, path: str, start: int, count_tokens, max_tokens: int) -> FileSlice:
        """Whole lines of `path` from line `start` (1-based) while their token counts (each line counted
        alone by `count_tokens(text) -> int`) fit in `max_tokens`; at least one line; wraps to line 1 past the
        end of the file."""
        lines = self.lines(path)
        start = (start - 1) % len(lines) + 1
        end, used = start - 1, 0
        while end < len(lines):
            n = count_tokens(lines[end])
            if end >= start and used + n > max_tokens:
                break
            used, end = used + n, end + 1
        return FileSlice(path, start, end, "".join(lines[start - 1:end]))

"""`SessionGenerator`: agent sessions over this repository's code → a Mooncake trace and the prompt texts.

A session (ChatML, the default model's template) is the system prompt (a tool schema and the repository's
README, cut to `system_tokens`), a task, then one request per turn. Turn k's prompt is turn k-1's prompt plus
the agent's tool call, the tool's output (a `read_file` slice of a source file, `codebase.py`) and the
assistant header: the session grows by one tool output per turn and every prompt starts with the previous
one, as a coding agent resends its whole context. The last turn of a session asks for an edit of the code it
read last (the answer copies most of it). Cold sessions open with one long file pasted at once.

Appended texts start after a newline, so BPE never merges across them: a turn's token ids are the previous
turn's ids plus the appended text's (`tests/coding_agent/test_trace.py` checks this on the committed trace).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from case_coding_agent.loadtest.codebase import REPO, Codebase
from case_coding_agent.loadtest.trace import BlockHasher, TraceRecord

CASE_DIR = Path(__file__).resolve().parents[1]
WORKLOAD_FILE = CASE_DIR / "workload.yaml"

TOOLS = [
    {"name": "read_file", "description": "Read lines start..end (1-based, inclusive) of a file.",
     "parameters": {"path": "string", "start": "integer", "end": "integer"}},
    {"name": "grep", "description": "Search the repository for a regular expression.",
     "parameters": {"pattern": "string", "path": "string"}},
    {"name": "edit_file", "description": "Replace lines start..end of a file with new text.",
     "parameters": {"path": "string", "start": "integer", "end": "integer", "text": "string"}},
    {"name": "run_tests", "description": "Run pytest on a path and return the summary.",
     "parameters": {"path": "string"}},
]
TASKS = ["rename the helper that computes {what} to something clearer", "add a docstring to every public "
         "function", "make the error messages name the offending field", "remove the dead code path",
         "add type hints where they are missing", "split the longest function into two"]


@dataclass(frozen=True)
class Range:
    min: float
    max: float

    def sample(self, rng: np.random.Generator, integer: bool = True):
        if integer:
            return int(rng.integers(int(self.min), int(self.max) + 1))
        return float(rng.uniform(self.min, self.max))


@dataclass(frozen=True)
class Profile:
    name: str
    block_tokens: int
    sessions: int
    stagger_s: float
    turns: Range
    system_tokens: int
    tool_output_tokens: Range
    output_tokens: Range
    pause_s: Range
    cold_sessions: dict
    max_context_tokens: int
    seed: int


def load_profile(name: str, path: Path = WORKLOAD_FILE) -> Profile:
    """The named profile of workload.yaml. Raises KeyError naming the profiles there."""
    profiles = yaml.safe_load(path.read_text())["profiles"]
    if name not in profiles:
        raise KeyError(f"no profile {name!r} in {path} (have {sorted(profiles)})")
    p = dict(profiles[name])
    for key in ("turns", "tool_output_tokens", "output_tokens", "pause_s"):
        p[key] = Range(**p[key])
    return Profile(name=name, **p)


class SessionGenerator:
    """`tokenizer`: a `tokenizers.Tokenizer` (the default model's). Deterministic for a profile, a seed and
    the repository's files."""

    def __init__(self, profile: Profile, tokenizer, codebase: Codebase | None = None) -> None:
        self.p = profile
        self.tok = tokenizer
        self.code = codebase or Codebase()
        self.rng = np.random.default_rng(profile.seed)
        self.hasher = BlockHasher(profile.block_tokens)

    def ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def count(self, text: str) -> int:
        return len(self.ids(text))

    def system_prompt(self) -> str:
        head = ("<|im_start|>system\nYou are a coding agent working in the repository `llm-serving-lab`. "
                "Call one tool per turn as name(arguments). Tools (JSON):\n" + json.dumps(TOOLS, indent=1)
                + "\nThe repository's README follows.\n")
        budget = self.p.system_tokens - self.count(head) - 2
        lines = (REPO / "README.md").read_text().splitlines(keepends=True)
        body, used = "", 0
        for line in lines:
            n = self.count(line)
            if used + n > budget:
                break
            body, used = body + line, used + n
        return head + body + "<|im_end|>\n"

    def generate(self) -> tuple[dict, list[TraceRecord], list[dict]]:
        """(header, trace records, prompt rows). A prompt row: request_id, session_id, turn, kind
        (`read`, `edit`, `cold`), and `append`, the text added to the previous turn's prompt (turn 1: all)."""
        system = self.system_prompt()
        system_ids = self.ids(system)
        records, rows = [], []
        starts = [(f"s{i:02d}", i * self.p.stagger_s / max(1, self.p.sessions) + self.rng.uniform(0, 0.5), False)
                  for i in range(self.p.sessions)]
        cold = self.p.cold_sessions
        starts += [(f"cold{c}", cold["first_at_s"] + c * cold["every_s"], True) for c in range(cold["count"])]
        for session_id, start_s, is_cold in starts:
            self._session(session_id, start_s, is_cold, system, system_ids, records, rows)
        header = {"format": "mooncake", "block_tokens": self.p.block_tokens, "profile": self.p.name,
                  "tokenizer": "SmolLM2-135M-Instruct", "generator": "case_coding_agent/loadtest/make_trace.py",
                  "long_prefill_tokens": cold["first_turn_tokens"] // 2 if cold["count"] else None,
                  "num_sessions": len(starts), "num_requests": len(records)}
        return header, records, rows

    def _session(self, session_id, start_s, is_cold, system, system_ids, records, rows) -> None:
        p, rng = self.p, self.rng
        path = self.code.paths[int(rng.integers(len(self.code.paths)))]
        turns = p.cold_sessions["turns"] if is_cold else p.turns.sample(rng)
        if is_cold:
            paste = self._paste(p.cold_sessions["first_turn_tokens"] - len(system_ids) - 40)
            append = (system + "<|im_start|>user\nReview these files and list their problems:\n"
                      + paste + "<|im_end|>\n<|im_start|>assistant\n")
        else:
            task = TASKS[int(rng.integers(len(TASKS)))].format(what="block hashes")
            append = system + f"<|im_start|>user\nTask: in `{path}`, {task}.<|im_end|>\n<|im_start|>assistant\n"
        ids = self.ids(append)
        t_ms = start_s * 1000
        for turn in range(1, turns + 1):
            kind = "cold" if is_cold and turn == 1 else ("edit" if turn == turns and turn > 1 else "read")
            if turn > 1:
                read_tokens = p.tool_output_tokens.sample(rng)
                line = int(rng.integers(1, len(self.code.lines(path)) + 1))
                piece = self._read(path, line, read_tokens)
                text = piece.text
                if self.count(text) < read_tokens // 2:  # the file ended: the agent reads the next one too
                    text += self._paste(read_tokens - self.count(text), after=path)
                append = (f'read_file(path="{path}", start={piece.start}, end={piece.end})<|im_end|>\n'
                          f"<|im_start|>tool\n{text}<|im_end|>\n")
                if kind == "edit":
                    append += (f"<|im_start|>user\nNow rewrite lines {piece.start}-{piece.end} of `{path}` with "
                               "the change. Reply with the complete new code only.<|im_end|>\n")
                append += "<|im_start|>assistant\n"
                t_ms += 1000 * p.pause_s.sample(rng, integer=False)
                if rng.random() < 0.3:  # the agent moves on to another file
                    path = self.code.paths[int(rng.integers(len(self.code.paths)))]
            new_ids = ids + self.ids(append) if turn > 1 else ids
            output = p.output_tokens.sample(rng)
            if len(new_ids) + output > p.max_context_tokens:
                break
            ids = new_ids
            request_id = f"{session_id}-t{turn:02d}"
            records.append(TraceRecord(timestamp=int(round(t_ms)), input_length=len(ids), output_length=output,
                                       hash_ids=self.hasher.hash_ids(ids), session_id=session_id, turn=turn,
                                       request_id=request_id))
            rows.append({"request_id": request_id, "session_id": session_id, "turn": turn, "kind": kind,
                         "append": append})

    def _paste(self, max_tokens: int, after: str | None = None) -> str:
        """Whole files from a random one on (or from the one after `after`), each under a `# file:` line, cut
        to `max_tokens` (by lines)."""
        paths = self.code.paths
        first = paths.index(after) + 1 if after else int(self.rng.integers(len(paths)))
        text, used = "", 0
        for k in range(len(paths)):
            path = paths[(first + k) % len(paths)]
            piece = self._read(path, 1, max_tokens - used - 8)
            text += f"# file: {path}\n" + piece.text
            used = self.count(text)
            if used >= max_tokens - 40:
                break
        return text

    def _read(self, path: str, start: int, max_tokens: int):
        return self.code.read(path, start, self.count, max_tokens)

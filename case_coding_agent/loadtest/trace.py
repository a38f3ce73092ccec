"""`TraceRecord`: one request of a Mooncake-format trace (JSON lines), and the block hashes it carries.

Mooncake's trace format (kvcache-ai/Mooncake, FAST'25 traces): one JSON object per request with
`timestamp` (ms from the trace's start), `input_length` and `output_length` (tokens) and `hash_ids`: one id
per `block_tokens`-token block of the prompt (the last block may be partial), equal ids meaning equal token
prefixes up to and including that block (the hash is chained). Mooncake's blocks are 512 tokens; the CPU
profile of this case uses 64 (its sessions are a few thousand tokens, so 512 would leave a handful of ids per
prompt); the trace's header line says which.

Extra keys, ignored by Mooncake-format readers that do not know them: `session_id`, `turn` (1-based) and
`request_id`. Timestamps are what the arrivals would be if every turn took no time: replayers (the load test,
the simulator) send a session's turn k+1 `timestamp[k+1] - timestamp[k]` ms (the tool pause) after turn k
*finished*, and a session's first turn at its timestamp.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

HEADER_KEY = "trace_header"


@dataclass(frozen=True)
class TraceRecord:
    timestamp: int  # ms since the trace's start
    input_length: int  # prompt tokens
    output_length: int  # generated tokens (the load test sets max_tokens and ignore_eos)
    hash_ids: list[int]  # one per block_tokens-token block of the prompt, the last possibly partial
    session_id: str
    turn: int  # 1-based
    request_id: str

    def __post_init__(self) -> None:
        if self.input_length < 1 or self.output_length < 1 or self.timestamp < 0 or self.turn < 1:
            raise ValueError(f"bad trace record {self.request_id}: input_length {self.input_length}, "
                             f"output_length {self.output_length}, timestamp {self.timestamp}, turn {self.turn}")


class BlockHasher:
    """Chained block hashes of token-id lists → small integers, numbered in first-seen order (as Mooncake's
    published traces are). The same token prefix always gets the same ids."""

    def __init__(self, block_tokens: int) -> None:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.block_tokens = block_tokens
        self._ids: dict[bytes, int] = {}

    def hash_ids(self, token_ids: list[int]) -> list[int]:
        out, parent = [], b""
        for start in range(0, len(token_ids), self.block_tokens):
            block = np.asarray(token_ids[start:start + self.block_tokens], dtype=np.int64).tobytes()
            parent = hashlib.sha256(parent + block).digest()
            out.append(self._ids.setdefault(parent, len(self._ids)))
        return out


def write_trace(path: Path, header: dict, records: list[TraceRecord]) -> None:
    """A header line `{"trace_header": {...}}` (block_tokens, tokenizer, generator, profile), then one line
    per record in timestamp order."""
    lines = [json.dumps({HEADER_KEY: header})]
    lines += [json.dumps(asdict(r), separators=(",", ":")) for r in sorted(records, key=lambda r: r.timestamp)]
    path.write_text("\n".join(lines) + "\n")


def read_trace(path: Path) -> tuple[dict, list[TraceRecord]]:
    """(header, records). A plain Mooncake trace (no header, no session keys) reads too: each request is
    then its own one-turn session. Raises ValueError on a malformed line (naming the line number)."""
    header: dict = {"block_tokens": 512}
    records = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if HEADER_KEY in obj:
                header = obj[HEADER_KEY]
                continue
            obj.setdefault("request_id", f"req-{number}")
            obj.setdefault("session_id", obj["request_id"])
            obj.setdefault("turn", 1)
            records.append(TraceRecord(**obj))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{number}: not a Mooncake trace record: {exc}") from exc
    return header, records


def sessions(records: list[TraceRecord]) -> dict[str, list[TraceRecord]]:
    """Records grouped by session, each session's turns in order."""
    out: dict[str, list[TraceRecord]] = {}
    for r in sorted(records, key=lambda r: (r.session_id, r.turn)):
        out.setdefault(r.session_id, []).append(r)
    return out


def synthetic_token_ids(record: TraceRecord, block_tokens: int, vocab_size: int, first_id: int = 10) -> list[int]:
    """Token ids with the trace's sharing (what a replay with dummy weights sends): hash id h becomes
    `block_tokens` ids drawn from a generator seeded by h, the last block cut to the input length. Two
    records share exactly their common hash-id prefix (to block granularity)."""
    ids: list[int] = []
    for h in record.hash_ids:
        rng = np.random.default_rng(h)
        ids += rng.integers(first_id, vocab_size, block_tokens).tolist()
    return ids[:record.input_length]

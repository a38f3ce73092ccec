"""A tokenizer directory whose vocabulary covers a dummy model's: SmolLM2's tokenizer (49,152 ids, the only one
on the H200 device) with filler tokens up to `--vocab-size` (llama-3.1-8b: 128,256).

Why: a dummy-weight llama-3.1-8b samples ids over its whole vocabulary. With SmolLM2's tokenizer every id at
or above 49,152 decodes to "" and the server sends no content chunk for it (streaming.ChoiceCursor), so a
client's TTFT (the first content chunk) would be late by however many such ids came first, and an answer of
only such ids would have no TTFT at all. Filler id i decodes to " t<i>": every id is text at once. Encoding
is unchanged (the fillers have no merges, so no text encodes to them); the chat template is SmolLM2's.

    python case_multilora/loadtest/wide_tokenizer.py h200_tokenizer /tmp/wide_tokenizer --vocab-size 128256
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def widen(src: Path, dst: Path, vocab_size: int) -> int:
    """Copy `src` (a Hugging Face tokenizer directory with a byte-level BPE tokenizer.json) to `dst` with
    filler tokens for ids [len(vocab), vocab_size). Returns the number added.

    Raises:
        ValueError: not a BPE tokenizer.json, or ids already at or above `vocab_size` in use."""
    data = json.loads((src / "tokenizer.json").read_text())
    model = data["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{src}: a BPE tokenizer.json is needed, got {model.get('type')}")
    used = set(model["vocab"].values()) | {t["id"] for t in data.get("added_tokens", [])}
    start = max(used) + 1
    if start > vocab_size:
        raise ValueError(f"{src} already uses ids up to {start - 1} >= vocab_size {vocab_size}")
    for i in range(start, vocab_size):
        model["vocab"][f"\u0120t{i}"] = i  # "Ġ" is the byte-level space
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "tokenizer.json":
            shutil.copy2(f, dst / f.name)
    (dst / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    return vocab_size - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--vocab-size", type=int, default=128256)
    args = p.parse_args(argv)
    print(f"added {widen(args.src, args.dst, args.vocab_size)} filler tokens: {args.dst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A stand-in tokenizer for dummy-weight presets, so that the server streams one text delta per token.

A shape preset (`--model llama-3.1-8b --load-format dummy`) has no tokenizer, and the server sends text
deltas only (a token without text waits for the next one): without a tokenizer a streamed answer arrives
in one piece at the end and TTFT and ITL cannot be measured. This writes a Hugging Face tokenizer directory
whose vocabulary is one word per token id (`t0`, `t1`, ... up to the model's vocabulary size), so every
generated id decodes to non-empty text. Prompts are token ids, so nothing is ever encoded with it.

    python case_rag_chatbot/loadtest/synthetic_tokenizer.py --vocab-size 128256 --out /tmp/tok
    python -m shared_engine serve --model llama-3.1-8b --load-format dummy --tokenizer /tmp/tok
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def write_tokenizer(out_dir: Path, vocab_size: int) -> Path:
    """Write `tokenizer.json` + `tokenizer_config.json` (a word-level vocabulary of `vocab_size` ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 20, "unk_token": "t0"}
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return out_dir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab-size", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    print(write_tokenizer(args.out, args.vocab_size))


if __name__ == "__main__":
    main()

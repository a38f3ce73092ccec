"""Lower bounds on a text's token count that cost far less than tokenising it, so that a prompt (or a
rendered chat) that cannot fit the context is refused before the tokenizer runs.

Tokenising costs about 1 s per MB on one core; a 7.5 MB prompt (under the 8 MiB body cap) took 6-9 s to
tokenise before it was refused for its length. Two bounds, both derived from the tokenizer's vocabulary at
startup (`TokenBounds.from_tokenizer`, about 0.2 s for a 49k vocabulary):

- bytes: no token stands for more than `max_bytes_per_token` UTF-8 bytes (81 for SmolLM2: a newline and
  80 spaces), so a text of b bytes has at least ceil(b / max_bytes_per_token) tokens (O(1) after the text's
  UTF-8 length; checked on the event loop);
- runs: where no token's text holds two whitespace-separated runs (true of byte-level BPE with a GPT-2
  pre-tokenizer, SmolLM2 included), a text has at least as many tokens as it has runs (`len(text.split())`,
  about 0.1 s per MB: checked in the tokenizer pool, before encoding).

Both hold only when the tokenizer's normalizer cannot shrink text (none, or the prepend / replace-space
steps of SentencePiece-style tokenizers); otherwise `max_bytes_per_token` is None and `runs` False, and
texts are tokenised before their length is checked. Special tokens written in a prompt are tokens of the
vocabulary too (their text's bytes are counted), and added tokens such as BOS only add to the count.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from shared_engine.entrypoints.openai.errors import bad_request

# Shorter texts are tokenised whatever their bounds say: about 10 ms, and the 400 then gives the exact count.
EXACT_BELOW_BYTES = 16 * 1024


def _normalizer_keeps_length(spec: dict | None) -> bool:
    """True for no normalizer, or steps that never remove or merge characters."""
    if spec is None:
        return True
    kind = spec.get("type")
    if kind == "Sequence":
        return all(_normalizer_keeps_length(s) for s in spec.get("normalizers", []))
    if kind == "Prepend":
        return True
    if kind == "Replace":  # SentencePiece's " " -> "▁" (one character for one, 1 byte for 3)
        pattern = spec.get("pattern", {})
        return pattern.get("String") == " " and spec.get("content") == "\u2581"
    return False


@dataclass(frozen=True)
class TokenBounds:
    """`max_bytes_per_token`: the most UTF-8 bytes one token stands for (None: no bound is safe);
    `runs`: every token's text holds at most one whitespace-separated run."""

    max_bytes_per_token: int | None = None
    runs: bool = False

    @classmethod
    def from_tokenizer(cls, tokenizer) -> TokenBounds:
        """Bounds for a Hugging Face fast tokenizer; no bounds for None or a slow tokenizer."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return cls()
        try:
            normalizer = None if backend.normalizer is None else json.loads(backend.to_str()).get("normalizer")
        except (ValueError, AttributeError):
            return cls()
        if not _normalizer_keeps_length(normalizer):
            return cls()
        texts = [backend.decode([i], skip_special_tokens=False)
                 for i in range(backend.get_vocab_size(with_added_tokens=True))]
        # a token that is part of a UTF-8 character decodes to U+FFFD (3 bytes), more than its own bytes
        most = max((len(t.encode("utf-8", "surrogatepass")) for t in texts), default=0)
        return cls(max_bytes_per_token=max(most, 1), runs=all(len(t.split()) <= 1 for t in texts))

    def lower_bound(self, text: str, full: bool = False, enough: int | None = None) -> tuple[int, str]:
        """(at least this many tokens, why) by bytes, and with `full` by runs too (linear: off the loop),
        unless the bytes already show more than `enough`."""
        size = len(text.encode("utf-8", "surrogatepass"))
        best = (0, "")
        if self.max_bytes_per_token is not None:
            least = math.ceil(size / self.max_bytes_per_token)
            best = (least, f"{size} bytes long, so at least {least} tokens (no token of this tokenizer is longer "
                           f"than {self.max_bytes_per_token} bytes)")
        if full and self.runs and (enough is None or best[0] <= enough):
            runs = len(text.split())
            if runs > best[0]:
                best = (runs, f"{runs} whitespace-separated words, so at least {runs} tokens")
        return best

    def check_context(self, text: str, max_model_len: int, param: str, full: bool = False) -> None:
        """Raises `APIError` 400 (`param`, the context-overflow message) when `text` (of at least
        `EXACT_BELOW_BYTES` characters) surely has more than `max_model_len` tokens."""
        if len(text) < EXACT_BELOW_BYTES:  # characters <= bytes
            return
        count, why = self.lower_bound(text, full, enough=max_model_len)
        if count > max_model_len:
            raise bad_request(f"This model's maximum context length is {max_model_len} tokens. However, your "
                              f"prompt is {why}. Please reduce the prompt.", param)

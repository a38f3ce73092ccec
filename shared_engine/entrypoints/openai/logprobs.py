"""Log-probabilities in OpenAI's two shapes: completions (`tokens`, `token_logprobs`, `top_logprobs`,
`text_offset`) and chat (`content: [{token, logprob, bytes, top_logprobs}]`).

Token strings: a byte-level BPE token that holds only part of a UTF-8 character is shown as `\\xNN`
escapes (as OpenAI does) and its exact `bytes` are given. JSON has no -Infinity: logprobs below
`MIN_LOGPROB` (or NaN) are reported as `MIN_LOGPROB`.
"""

from __future__ import annotations

import math
from functools import lru_cache

from shared_engine.entrypoints.openai.protocol import (
    CompletionLogprobs,
    PromptLogprob,
    PromptLogprobs,
    TokenLogprob,
    TopLogprob,
)
from shared_engine.outputs import Logprob

MIN_LOGPROB = -9999.0


def finite(value: float | None) -> float | None:
    if value is None:
        return None
    return MIN_LOGPROB if math.isnan(value) or value < MIN_LOGPROB else float(value)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's byte-level alphabet: printable bytes stand for themselves, the other bytes
    for the code points 256, 257, ... in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class TokenText:
    """Token id → (display string, UTF-8 bytes), cached."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._compute(token_id)
        return hit

    def _compute(self, token_id: int) -> tuple[str, list[int]]:
        piece = self.tokenizer.convert_ids_to_tokens(token_id) or ""
        decoder = _byte_decoder()
        if piece and all(ch in decoder for ch in piece):
            raw = bytes(decoder[ch] for ch in piece)
        else:
            raw = self.tokenizer.decode([token_id]).encode("utf-8")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = "".join(f"\\x{b:02x}" for b in raw)
        return text, list(raw)


def _ranked(entry: dict[int, Logprob], k: int) -> list[tuple[int, Logprob]]:
    items = sorted(entry.items(), key=lambda kv: (kv[1].rank or 1 << 30, -kv[1].logprob))
    return [(tid, lp) for tid, lp in items if lp.rank is not None and lp.rank <= k][:k]


def completion_logprobs(text: TokenText, token_ids: list[int], entries: list[dict[int, Logprob] | None],
                        k: int, offset: int = 0) -> CompletionLogprobs:
    """`entries[i]` is None for a token without a logprob (the first prompt token). `offset` is the
    `text_offset` of the first token (a stream's later chunks continue where the last one ended)."""
    out = CompletionLogprobs()
    for token_id, entry in zip(token_ids, entries):
        token, _ = text(token_id)
        out.tokens.append(token)
        out.text_offset.append(offset)
        offset += len(token)
        if entry is None:
            out.token_logprobs.append(None)
            out.top_logprobs.append(None)
            continue
        chosen = entry.get(token_id)
        out.token_logprobs.append(finite(chosen.logprob) if chosen else None)
        top = {text(tid)[0]: finite(lp.logprob) for tid, lp in _ranked(entry, k)}
        if chosen is not None:
            top.setdefault(token, finite(chosen.logprob))
        out.top_logprobs.append(top)
    return out


def chat_logprobs(text: TokenText, token_ids: list[int], entries: list[dict[int, Logprob]],
                  k: int) -> list[TokenLogprob]:
    content = []
    for token_id, entry in zip(token_ids, entries):
        token, raw = text(token_id)
        chosen = entry.get(token_id)
        top = []
        for tid, lp in _ranked(entry, k):
            t, b = text(tid)
            top.append(TopLogprob(token=t, logprob=finite(lp.logprob), bytes=b))
        content.append(TokenLogprob(token=token, logprob=finite(chosen.logprob) if chosen else MIN_LOGPROB,
                                    bytes=raw, top_logprobs=top))
    return content


def prompt_logprobs(text: TokenText, token_ids: list[int], entries: list[dict[int, Logprob] | None] | None,
                    k: int) -> PromptLogprobs:
    """vLLM's `prompt_logprobs`: per prompt position (None for the first), the prompt token's own entry
    and the top `k`, keyed by token id."""
    out: PromptLogprobs = []
    for token_id, entry in zip(token_ids, entries or [None] * len(token_ids)):
        if entry is None:
            out.append(None)
            continue
        keep = dict(_ranked(entry, k))
        if token_id in entry:
            keep[token_id] = entry[token_id]
        out.append({str(tid): PromptLogprob(logprob=finite(lp.logprob), rank=lp.rank, decoded_token=text(tid)[0])
                    for tid, lp in keep.items()})
    return out

"""`IncrementalDetokenizer`: generated ids → text, a few tokens at a time, with stop strings.

Decoding window (as vLLM's incremental detokenisation): decode `ids[prefix_offset:]` and subtract the
text of `ids[prefix_offset:read_offset]`, so spaces and merges that depend on the previous tokens come
out right, and a delta that ends in U+FFFD (half a UTF-8 character) is held until the next token
completes it. The window starts inside the prompt, so offsets are right for token-id prompts too.

Stop strings are matched on the decoded text across token boundaries. `stream_safe_len` is how much of
the text can be sent: it excludes a tail that may still turn out to be the start of a stop string.
"""

from __future__ import annotations

_PROMPT_CONTEXT = 5  # prompt tokens decoded before the first generated token


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], stop: list[str], skip_special_tokens: bool = True,
                 include_stop_str_in_output: bool = False) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-_PROMPT_CONTEXT:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop = stop
        self.skip_special_tokens = skip_special_tokens
        self.include_stop = include_stop_str_in_output
        self.text = ""
        self.stop_hit: str | None = None

    def update(self, new_ids: list[int], check_stop: bool = True) -> str | None:
        """Append generated ids; returns the stop string when one now appears in the text (the text is
        then cut before it, or after it with `include_stop_str_in_output`)."""
        start = len(self.text)
        for token in new_ids:
            self.ids.append(token)
            self.text += self._delta()
        if check_stop and self.stop and self.stop_hit is None:
            self._match_stop(start)
        return self.stop_hit

    def flush(self) -> None:
        """On finish, emit any bytes still held back (a trailing incomplete character decodes to U+FFFD)."""
        if self.stop_hit is None and self.read_offset < len(self.ids):
            prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
            self.text += self._decode(self.ids[self.prefix_offset :])[len(prefix) :]
            self.read_offset = len(self.ids)

    @property
    def stream_safe_len(self) -> int:
        """Characters of `text` that can be sent now: all but a tail that is a proper prefix of a stop
        string (it may still become one)."""
        if self.stop_hit is not None or not self.stop:
            return len(self.text)
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        return len(self.text) - hold

    def _delta(self) -> str:
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return full[len(prefix) :]
        return ""

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def _match_stop(self, start: int) -> None:
        best = None
        for s in self.stop:
            idx = self.text.find(s, max(0, start - len(s) + 1))
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, s)
        if best is not None:
            idx, s = best
            self.text = self.text[: idx + len(s)] if self.include_stop else self.text[:idx]
            self.stop_hit = s

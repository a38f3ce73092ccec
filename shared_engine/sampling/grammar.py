"""`GrammarBackend`: constrained decoding (JSON schema, JSON object, Lark grammar) through llguidance.

llguidance (https://github.com/guidance-ai/llguidance, the library behind vLLM's `guidance` backend) compiles
a grammar against the tokenizer's vocabulary and, for each step, computes which tokens may come next as a
bitmask: `[ceil(vocab / 32)]` int32, bit `i % 32` of word `i // 32` set when token `i` is allowed. EOS is
allowed exactly when the text so far is a complete match; once the grammar can take nothing more, only EOS
is. JSON is generated compact with Python's separators (`", "`, `": "`) and no other whitespace: a free
whitespace rule lets small models emit newlines until `max_tokens`.

A `GrammarMatcher` per request follows its output tokens; `LogitsProcessors` brings it up to date before
each step (the output tokens are final by then: with async scheduling a constrained request waits for the
step in flight) and, for speculative decoding, walks it over draft tokens and back (`mask_after`).
"""

from __future__ import annotations

import json
from functools import cached_property

import torch

from shared_engine.sampling_params import StructuredOutputsParams

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_text(params: StructuredOutputsParams) -> str:
    """The llguidance grammar for `params`. Raises ValueError for a schema that is not JSON."""
    import llguidance

    if params.grammar is not None:
        return llguidance.LLMatcher.grammar_from_lark(params.grammar)
    schema = {"type": "object"} if params.json_object else params.json
    if isinstance(schema, str):
        schema = json.loads(schema)
    return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)


class GrammarBackend:
    """Compiles grammars for one tokenizer. `vocab_size` is the model's (the logits' width, which may
    exceed the tokenizer's); `eos_token_ids` end a constrained output. The llguidance tokenizer is built
    on first use (~0.3 s for a 49k vocabulary)."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)

    @cached_property
    def ll_tokenizer(self):
        import llguidance.hf

        return llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size,
                                            eos_token=self.eos_token_ids or None)

    def validate(self, params: StructuredOutputsParams) -> None:
        """Raises ValueError naming what is wrong with the schema or grammar."""
        import llguidance

        try:
            text = grammar_text(params)
        except Exception as e:  # noqa: BLE001 - whatever the compiler rejects is the client's schema
            raise ValueError(f"invalid JSON schema: {e}") from e
        try:
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, self.ll_tokenizer)
        except Exception as e:  # noqa: BLE001 - likewise
            raise ValueError(f"invalid grammar: {e}") from e
        if is_error:
            raise ValueError(f"invalid grammar: {messages[0] if messages else 'rejected by llguidance'}")

    def matcher(self, params: StructuredOutputsParams) -> GrammarMatcher:
        """A matcher for `params` (validated at add_request). Should compiling still fail, the matcher
        refuses everything but EOS: the request ends, the engine's step does not fail."""
        import llguidance

        try:
            text = grammar_text(params)
        except Exception:  # noqa: BLE001 - see the docstring
            text = llguidance.LLMatcher.grammar_from_regex("[")  # invalid: the matcher starts in its error state
        return GrammarMatcher(llguidance.LLMatcher(self.ll_tokenizer, text, log_level=0), self.vocab_size,
                              self.eos_token_ids)


class GrammarMatcher:
    """One request's grammar state: `num_consumed` of its output tokens have been fed to it."""

    def __init__(self, matcher, vocab_size: int, eos_token_ids: list[int]) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._eos_token_ids = eos_token_ids
        self.num_consumed = 0

    def advance(self, output_token_ids: list[int]) -> None:
        """Feed the output tokens not yet consumed. A token the grammar refuses (it cannot be sampled
        under the mask) leaves the matcher in its error state, whose mask allows only EOS."""
        new = output_token_ids[self.num_consumed:]
        if any(t < 0 for t in new):
            raise RuntimeError("a grammar needs its request's sampled tokens (a placeholder was found)")
        if new:
            self._matcher.consume_tokens(new)
        self.num_consumed = len(output_token_ids)

    def mask_after(self, draft_token_ids: list[int]) -> torch.Tensor | None:
        """Allowed next tokens after the consumed ones plus `draft_token_ids` (speculative decoding; empty
        otherwise), as a `[vocab_size]` bool tensor on the CPU; None when the grammar refuses a draft
        token (that position cannot be reached). The matcher is left where it was."""
        accepted = self._matcher.try_consume_tokens(list(draft_token_ids)) if draft_token_ids else 0
        try:
            if accepted < len(draft_token_ids):
                return None
            if self._matcher.is_error():
                allowed = torch.zeros(self._vocab_size, dtype=torch.bool)
                allowed[self._eos_token_ids] = True
                return allowed
            words = torch.frombuffer(bytearray(self._matcher.compute_bitmask()), dtype=torch.int32)
            return unpack_bitmask(words, self._vocab_size)
        finally:
            if accepted:
                self._matcher.rollback(accepted)


def unpack_bitmask(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`[..., ceil(vocab / 32)]` int32 bitmask → `[..., vocab_size]` bool (True = allowed)."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = (words[..., None] >> shifts) & 1  # [..., words, 32]
    return bits.flatten(-2)[..., :vocab_size].bool()


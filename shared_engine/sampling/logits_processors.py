"""`LogitsProcessors`: everything that changes a request's logits before sampling, in one place.

Applied by the `Sampler` to one row per request, and usable on any `[num_rows, vocab]` block whose rows
are positions of requests (speculative decoding verifies several positions of one request per step: row
`i` is the position after `request.output_token_ids + draft_token_ids[i]`). In order, as vLLM v1:

1. the grammar's bitmask (`structured_outputs`, sampling/grammar.py): disallowed tokens get -inf;
2. `logit_bias`: added to the listed tokens' logits (OpenAI's semantics);
3. `min_tokens`: EOS and `stop_token_ids` get -inf while fewer than `min_tokens` tokens were generated
   before the row's position (vLLM's `MinTokensLogitsProcessor`, transformers' `min_new_tokens`); never
   together with a grammar (`SamplingParams` refuses the pair: a complete grammar allows only EOS);
4. penalties (sampling/penalties.py), counting the output tokens before the row's position.

The raw logprobs the API reports are taken before all of this (vLLM's default). Rows of requests that
need none of it are not touched; a block in which no row needs anything is returned as it is.
"""

from __future__ import annotations

import torch

from shared_engine.core.request import Request
from shared_engine.sampling.grammar import GrammarBackend, GrammarMatcher
from shared_engine.sampling.penalties import apply_penalties

_NEG_INF = float("-inf")


class LogitsProcessors:
    """Per-request processing state (grammar matchers), kept until `release(request_id)`."""

    def __init__(self, grammar: GrammarBackend | None = None) -> None:
        self.grammar = grammar
        self._matchers: dict[str, GrammarMatcher] = {}

    def release(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def apply(self, logits: torch.Tensor, requests: list[Request],
              draft_token_ids: list[list[int]] | None = None) -> torch.Tensor:
        """`logits` `[num_rows, vocab]` fp32; `requests[i]` owns row `i`; `draft_token_ids[i]` (default
        none) are the tokens between the request's output and row `i`'s position. Returns the processed
        logits: a new tensor when any row changed, else `logits` itself (never modified in place).

        Raises:
            RuntimeError: a structured-output request without a grammar backend (no tokenizer).
        """
        params = [r.sampling_params for r in requests]
        if not any(p.needs_logits_processing for p in params):
            return logits
        drafts = draft_token_ids or [[] for _ in requests]
        logits = logits.clone()
        vocab = logits.shape[1]
        for row, (request, p) in enumerate(zip(requests, params)):
            if p.structured_outputs is not None:
                self._apply_grammar(logits, row, request, drafts[row])
            bias = [(t, b) for t, b in (p.logit_bias or {}).items() if t < vocab]
            if bias:
                ids, values = zip(*bias)
                logits[row, list(ids)] += torch.tensor(values, dtype=logits.dtype, device=logits.device)
            if p.min_tokens and len(request.output_token_ids) + len(drafts[row]) < p.min_tokens:
                stop_ids = [t for t in request.eos_token_ids | set(p.stop_token_ids) if t < vocab]
                logits[row, stop_ids] = _NEG_INF
        if any(p.needs_penalties for p in params):
            apply_penalties(
                logits,
                [r.prompt_token_ids if p.repetition_penalty != 1.0 else [] for r, p in zip(requests, params)],
                [r.output_token_ids + list(d) if d else r.output_token_ids for r, d in zip(requests, drafts)],
                [p.presence_penalty for p in params],
                [p.frequency_penalty for p in params],
                [p.repetition_penalty for p in params],
            )
        return logits

    def _apply_grammar(self, logits: torch.Tensor, row: int, request: Request, draft: list[int]) -> None:
        matcher = self._matchers.get(request.request_id)
        if matcher is None:
            if self.grammar is None:
                raise RuntimeError("structured outputs need a tokenizer; this model has none")
            matcher = self._matchers[request.request_id] = self.grammar.matcher(
                request.sampling_params.structured_outputs)
        matcher.advance(request.output_token_ids)
        allowed = matcher.mask_after(draft)
        if allowed is not None:
            width = min(allowed.shape[0], logits.shape[1])
            logits[row, :width].masked_fill_(~allowed[:width].to(logits.device, non_blocking=True), _NEG_INF)
            logits[row, width:] = _NEG_INF

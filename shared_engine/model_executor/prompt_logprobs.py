"""Prompt logprobs (`prompt_logprobs`, completions `echo` with `logprobs`) in bounded memory.

The log-probability of prompt token i+1 given tokens 0..i needs the full-vocabulary log-softmax of
position i's logits. Over a whole prefill chunk that is a `[num_tokens, vocab]` fp32 tensor (8192 x 128k
x 4 bytes = 4 GiB for Llama 3 at the default token budget, twice over with the logits), which no memory
profile counts: one echo request could take the device out of memory and every stream with it. Here the
rows go through the LM head and the log-softmax `PROMPT_LOGPROBS_CHUNK` at a time, so the extra memory is
at most `2 * PROMPT_LOGPROBS_CHUNK * vocab * 4` bytes, and `ModelRunner`'s profiling pass runs one chunk
so that the KV cache is sized with it counted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

PROMPT_LOGPROBS_CHUNK = 128  # rows per LM head + log-softmax pass


def prompt_token_logprobs(compute_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                          targets: list[int], chunk: int = PROMPT_LOGPROBS_CHUNK) -> list[float]:
    """Logprob of `targets[i]` under the next-token distribution at `hidden[i]`.

    Args:
        compute_logits: the model's LM head, `[rows, hidden_size]` -> `[rows, vocab]` fp32.
        hidden: `[>= len(targets), hidden_size]` final hidden states, one row per prompt position.
        targets: the next prompt token at each row.
        chunk: rows per pass (bounds the temporary `[chunk, vocab]` tensors).
    Returns:
        `len(targets)` floats (natural log).
    """
    values: list[float] = []
    for start in range(0, len(targets), chunk):
        rows = targets[start : start + chunk]
        logprobs = torch.log_softmax(compute_logits(hidden[start : start + len(rows)]), dim=-1)  # [rows, vocab]
        index = torch.tensor(rows, dtype=torch.long, device=logprobs.device)
        values += logprobs[torch.arange(len(rows), device=logprobs.device), index].tolist()
    return values

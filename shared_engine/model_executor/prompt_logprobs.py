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

from shared_engine.outputs import Logprob

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
    return [entry[t].logprob for entry, t in zip(prompt_token_entries(compute_logits, hidden, targets, 0, chunk),
                                                  targets)]


def prompt_token_entries(compute_logits: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor,
                         targets: list[int], k: int, chunk: int = PROMPT_LOGPROBS_CHUNK) -> list[dict[int, Logprob]]:
    """Per row, `targets[i]`'s logprob and rank and the top `k` tokens' (ranks 1..k), as generated tokens'
    entries are (`prompt_logprobs=k`, echo with `logprobs=k`). Arguments as `prompt_token_logprobs`."""
    entries: list[dict[int, Logprob]] = []
    for start in range(0, len(targets), chunk):
        rows = targets[start : start + chunk]
        logprobs = torch.log_softmax(compute_logits(hidden[start : start + len(rows)]), dim=-1)  # [rows, vocab]
        index = torch.tensor(rows, dtype=torch.long, device=logprobs.device)
        chosen = logprobs.gather(1, index[:, None])  # [rows, 1]
        ranks = ((logprobs > chosen).sum(dim=1) + 1).tolist()
        top = logprobs.topk(k, dim=1) if k > 0 else None
        top_ids, top_values = (top.indices.tolist(), top.values.tolist()) if top is not None else ([], [])
        for i, (token, value) in enumerate(zip(rows, chosen[:, 0].tolist())):
            entry = {t: Logprob(v, rank=r + 1) for r, (t, v) in enumerate(zip(top_ids[i], top_values[i]))} if k else {}
            entry[token] = Logprob(value, rank=ranks[i])
            entries.append(entry)
    return entries


def step_prompt_logprobs(compute_logits: Callable[[torch.Tensor], torch.Tensor], out,
                         hidden: torch.Tensor) -> dict[str, tuple[int, list]]:
    """A step's prompt logprobs (`SchedulerOutput` `out`, its final hidden states `[num_tokens, hidden_size]` in
    the step's token order): for each request asking for `prompt_logprobs` whose prompt the step reaches,
    (index of its first entry, entries: `prompt_token_entries` of each prompt token given the ones before it,
    `None` first for position 0), in chunks of bounded memory."""
    result = {}
    offset = 0
    for item in out.scheduled:
        request = item.request
        if request.sampling_params.prompt_logprobs is not None and item.start_position < request.num_prompt_tokens:
            end = min(item.context_len, request.num_prompt_tokens)
            targets = request.prompt_token_ids[item.start_position + 1 : end + 1]
            entries = prompt_token_entries(compute_logits, hidden[offset : offset + len(targets)], targets,
                                           request.sampling_params.prompt_logprobs)
            if item.start_position == 0:
                result[request.request_id] = (0, [None, *entries])
            else:
                result[request.request_id] = (item.start_position + 1, entries)
        offset += item.num_new_tokens
    return result

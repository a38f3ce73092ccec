"""Presence, frequency and repetition penalties applied to one step's logits."""

from __future__ import annotations

import torch

from shared_engine.sampling.device_tensor import to_device


def apply_penalties(
    logits: torch.Tensor,  # [num_seqs, vocab] fp32, modified in place
    prompt_ids: list[list[int]],
    output_ids: list[list[int]],
    presence: list[float],
    frequency: list[float],
    repetition: list[float],
) -> None:
    """Penalise tokens already seen.

    Repetition (CTRL, Keskar et al. 2019): every token in prompt or output has its logit divided by the
    penalty when positive, multiplied when negative. Presence / frequency (OpenAI's definition): subtract
    `presence` once for each token generated so far and `frequency * count` of it; prompt tokens do not
    count.
    """
    vocab, device = logits.shape[1], logits.device
    for row in range(logits.shape[0]):
        if repetition[row] != 1.0:
            seen = to_device(sorted(set(prompt_ids[row]) | set(output_ids[row])), torch.long, device)
            values = logits[row, seen]
            logits[row, seen] = torch.where(values > 0, values / repetition[row], values * repetition[row])
        if (presence[row] or frequency[row]) and output_ids[row]:
            ids = to_device(output_ids[row], torch.long, device)
            counts = torch.zeros(vocab, dtype=logits.dtype, device=device).index_add_(
                0, ids, torch.ones(len(output_ids[row]), dtype=logits.dtype, device=device))
            logits[row] -= frequency[row] * counts + presence[row] * (counts > 0).to(logits.dtype)

"""What `ModelRunner` returns: a step enqueued on the device (`LaunchedStep`) and its collected tokens
(`StepResult`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared_engine.outputs import Logprob
from shared_engine.sampling.sampler import SampleResult


@dataclass
class StepResult:
    # request id → its new tokens: one, or a speculative decode's accepted drafts and its bonus token
    sampled: dict[str, list[SampleResult]]
    # request id → (first prompt position, from there per position the prompt token's and the top
    # `prompt_logprobs` tokens' logprobs with ranks; None for position 0)
    prompt_logprobs: dict[str, tuple[int, list[dict[int, Logprob] | None]]]

    def token_ids(self) -> dict[str, list[int]]:
        """request id → its new token ids (what `Scheduler.resolve` takes)."""
        return {rid: [r.token_id for r in results] for rid, results in self.sampled.items()}


@dataclass
class LaunchedStep:
    """A step enqueued on the device by `ModelRunner.launch`; `ModelRunner.collect` waits for it."""

    requests: list  # the sampled rows' requests, in row order
    # [num_sampled] int64 on the device: the next step's placeholder inputs read it (None for a step with
    # drafts, whose rows yield a variable number of tokens: it is resolved before the next is scheduled)
    tokens: torch.Tensor | None
    # [num_sampled, 1 + k] int64 on the host (pinned on CUDA), filled asynchronously: each row's new tokens,
    # then -1 (k = 0 without drafts)
    token_ids: torch.Tensor | None
    num_logits: list[int]  # per sampled row: its logits rows (1 + its draft tokens)
    copied: torch.cuda.Event | None  # recorded after the device-to-host copy of the token ids (CUDA)
    raw_logprobs: torch.Tensor | None  # [num_sampled, vocab] fp32 on the device, when logprobs were asked
    prompt_logprobs: dict[str, tuple[int, list[dict[int, Logprob] | None]]]
    # (start, end) timing events of the step's device work (CUDA). Events mark the stream, not the host: a
    # step launched while the previous one runs starts timing when the device reaches it.
    span: tuple | None

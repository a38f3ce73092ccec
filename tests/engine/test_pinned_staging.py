"""A step's inputs through `PinnedStaging` (one copy from pinned memory, model_executor/pinned_staging.py) equal
the per-array pageable copies, over a ring of reused buffers and growing sizes; CUDA only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shared_engine.core.request import Request
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.model_executor.input_builder import build_inputs
from shared_engine.model_executor.pinned_staging import PinnedStaging
from shared_engine.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu


def test_upload_round_trips_every_dtype_and_shape_through_the_ring():
    rng = np.random.default_rng(0)
    staging = PinnedStaging(torch.device("cuda"), depth=3)
    kept = []
    for n in range(12):  # more uploads than buffers, sizes growing past the first allocation
        arrays = [rng.integers(-2**40, 2**40, size=7 + 50_000 * n, dtype=np.int64),
                  rng.integers(-2**30, 2**30, size=(3 + n, 5 + 1000 * n), dtype=np.int32),
                  rng.random(11, dtype=np.float32), np.zeros(0, dtype=np.int64),
                  rng.integers(0, 9, size=(2, 3), dtype=np.int32)[:, 1]]  # not contiguous
        tensors = staging.upload(arrays)
        kept.append((arrays, tensors))
    torch.cuda.synchronize()
    for arrays, tensors in kept:  # earlier uploads' device tensors stay valid after their buffers are reused
        for a, t in zip(arrays, tensors):
            assert t.device.type == "cuda" and tuple(t.shape) == a.shape
            np.testing.assert_array_equal(t.cpu().numpy(), a)


def test_build_inputs_with_staging_equals_pageable_copies():
    rng = np.random.default_rng(1)
    items = []
    for i in range(40):  # decodes (one with a placeholder), a speculative decode, then prefill chunks
        table = [int(b) for b in rng.permutation(400)[:12]]
        request = Request(f"r{i}", [1] * 120, SamplingParams(max_tokens=8), max_tokens=8)
        if i < 30:
            items.append(ScheduledRequest(request, [-(i % 3 + 1)] if i == 7 else [int(rng.integers(1000))],
                                          100 + i, table, True))
        elif i == 30:
            items.append(ScheduledRequest(request, [5, 6, 7, 8], 90, table, True, num_draft_tokens=3))
        else:
            # a chunk from position 0 among them: the prefill path (no decode rows)
            items.append(ScheduledRequest(request, [int(t) for t in rng.integers(1000, size=13)], 16 * (i - 31),
                                          table, i % 2 == 0))
    out = SchedulerOutput(items, num_batched_tokens=sum(len(s.token_ids) for s in items), num_draft_tokens=3)
    device = torch.device("cuda")
    pageable = build_inputs(out, 16, device, cascade=True)
    staged = build_inputs(out, 16, device, cascade=True, staging=PinnedStaging(device))
    for a, b in [(pageable.input_ids, staged.input_ids), (pageable.positions, staged.positions),
                 (pageable.sample_indices, staged.sample_indices), *zip(pageable.placeholders, staged.placeholders)]:
        assert a.dtype == b.dtype and torch.equal(a, b)
    for name in ("slot_mapping", "block_tables", "context_lens", "cu_seqlens_q"):
        a, b = getattr(pageable.meta, name), getattr(staged.meta, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert staged.sampled_rows == pageable.sampled_rows and staged.num_logits == pageable.num_logits

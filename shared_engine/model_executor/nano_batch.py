"""Nano-batch overlap for large decode steps: the step's rows run as two nano-batches on two CUDA streams whose
attention (memory-bound: the KV read) and GEMMs (compute-bound at large batch) overlap, as NanoFlow does
(Zhu et al., "NanoFlow: Towards Optimal Large Language Model Serving Throughput", OSDI 2025).

Why: a decode step of llama-3.1-8b at batch 448 with 1,000-2,000-token contexts reads ~88 GB of KV (~18 ms at
the H200's copy bandwidth) and does ~7 TFLOP of GEMMs (~9 ms): run one after the other the step costs their sum,
while the roofline bound is their maximum (issue 23; benchmarks/roofline.py).

Schedule. Rows [0, n) split into nano-batch A = [0, m) on the step's stream and B = [m, n) on a side stream
(m = n / 2 rounded to 8). Each runs the whole decoder on its rows; the two never read each other's tensors
(every op but attention is row-wise, and attention reads each row's own blocks). Their attention calls take
turns: A's attention of layer l waits for B's attention of layer l - 1, B's of layer l for A's of layer l (one
CUDA event per call). So while one nano-batch reads its KV the other runs its o_proj, MLP and next qkv_proj:
per layer about max(attention, GEMMs) of one nano-batch twice, instead of their sum for the whole batch.
Host order: layer by layer, A then B, so every event is recorded (enqueued) before the wait that names it.

Inside CUDA graphs: the side stream forks from the capturing stream (`wait_stream`) and joins it before the
output is assembled, so the capture holds both branches and their event edges; the graph's memory pool serves
allocations of both streams (PyTorch's capture pools every stream that joined the capture). On the CPU (and in
an eager CUDA step, should one reach it) the same code runs the nano-batches one after the other: the CPU tests
check that the split forward equals the plain one.

Applies (`NanoBatchForward.applies`): decode-only layouts (every sequence one query row: plain decodes and
speculative decode rows) of at least `min_decodes` rows, without cascade attention and without LoRA layers.
Not with tensor parallelism (the all-reduces would run on two streams): `DeviceConfig.nano_batch_min_decodes`
is refused there by the model runner.
"""

from __future__ import annotations

import contextlib

import torch

from shared_engine.model_executor.attention.metadata import AttentionMetadata

_ALIGN = 8  # nano-batch boundary rounded to this many rows (GEMM tiles)


def split_point(num_rows: int) -> int:
    """Rows of nano-batch A for a step of `num_rows` rows: half, rounded to a multiple of 8 (at least 1)."""
    return max(1, min(num_rows - 1, round(num_rows / 2 / _ALIGN) * _ALIGN))


def slice_decodes(meta: AttentionMetadata, start: int, end: int) -> AttentionMetadata:
    """The metadata of decode rows [start, end) of a decode-only layout (one query token per sequence)."""
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping[start:end], block_tables=meta.block_tables[start:end],
        context_lens=meta.context_lens[start:end], cu_seqlens_q=meta.cu_seqlens_q[start : end + 1] - start,
        num_decodes=end - start, max_context_len=meta.max_context_len, max_query_len=1,
        context_lens_list=meta.context_lens_list[start:end], query_lens_list=meta.query_lens_list[start:end])


class _AttentionTurns:
    """Backends for the nano-batches whose attention calls run in turn: call g (layer g // P, nano-batch g % P)
    waits on the event recorded after call g - 1 (on the other stream). No events without CUDA."""

    def __init__(self, backend, num_parts: int, num_layers: int, cuda: bool) -> None:
        self.backend = backend
        self.num_parts = num_parts
        self.events = [torch.cuda.Event() for _ in range(num_parts * num_layers)] if cuda else None
        self.calls = [0] * num_parts  # attention calls each nano-batch has made (its layer)

    def for_part(self, part: int) -> _TurnBackend:
        return _TurnBackend(self, part)

    def forward(self, part: int, *args, **kwargs) -> torch.Tensor:
        g = self.calls[part] * self.num_parts + part
        self.calls[part] += 1
        if self.events is not None and g > 0:
            torch.cuda.current_stream().wait_event(self.events[g - 1])
        out = self.backend.forward(*args, **kwargs)
        if self.events is not None:
            self.events[g].record()
        return out


class _TurnBackend:
    def __init__(self, turns: _AttentionTurns, part: int) -> None:
        self.turns, self.part = turns, part

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.turns.forward(self.part, *args, **kwargs)


class NanoBatchForward:
    """`forward(input_ids [T], positions [T], kv_caches, meta, backend) -> hidden [T, hidden]`, like the
    model's own forward, for decode-only layouts (see the module docstring). `model` is a LlamaForCausalLM
    (`model.model.embed_tokens`, `.layers`, `.norm`). `min_decodes` >= 2: the fewest rows it applies to."""

    def __init__(self, model, min_decodes: int) -> None:
        if min_decodes < 2:
            raise ValueError(f"nano-batch overlap needs at least 2 rows to split, got min_decodes={min_decodes}")
        self.model = model
        self.min_decodes = min_decodes
        self._side: torch.cuda.Stream | None = None
        self.steps = 0  # forwards run as nano-batches (captures and eager steps; graph replays are not counted)

    def applies(self, meta: AttentionMetadata, num_tokens: int, lora: bool = False) -> bool:
        """Decode-only (every sequence one row), at least `min_decodes` rows, no cascade, no LoRA layers."""
        return (not lora and not meta.use_cascade and meta.num_decodes == meta.num_seqs == num_tokens
                and num_tokens >= self.min_decodes)

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(device=device)
        return self._side

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                 meta: AttentionMetadata, backend) -> torch.Tensor:
        n = input_ids.shape[0]
        m = split_point(n)
        bounds = ((0, m), (m, n))
        metas = [slice_decodes(meta, a, b) for a, b in bounds]
        cuda = input_ids.is_cuda
        main = torch.cuda.current_stream(input_ids.device) if cuda else None
        streams = (main, self._stream(input_ids.device)) if cuda else (None, None)
        if cuda:
            streams[1].wait_stream(main)  # fork: the side stream sees the step's inputs
        inner = self.model.model
        turns = _AttentionTurns(backend, len(bounds), len(inner.layers), cuda)
        states = []
        for part, (a, b) in enumerate(bounds):
            with _on(streams[part]):
                states.append((inner.embed_tokens(input_ids[a:b]), None))
        for layer, kv_cache in zip(inner.layers, kv_caches):
            for part, (a, b) in enumerate(bounds):
                with _on(streams[part]):
                    hidden, residual = states[part]
                    states[part] = layer(positions[a:b], hidden, residual, kv_cache, metas[part], turns.for_part(part))
        outs = []
        for part in range(len(bounds)):
            with _on(streams[part]):
                outs.append(inner.norm(*states[part])[0])
        if cuda:
            main.wait_stream(streams[1])  # join: B's rows are done before anyone reads them
        self.steps += 1
        return torch.cat(outs)


def _on(stream: torch.cuda.Stream | None):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

"""Nano-batch overlap for large decode steps: the step's rows run as two nano-batches on two CUDA streams whose
attention (memory-bound: the KV read) and GEMMs (compute-bound at large batch) overlap, as NanoFlow does
(Zhu et al., "NanoFlow: Towards Optimal Large Language Model Serving Throughput", OSDI 2025).

Why: a decode step of llama-3.1-8b at batch 448 with 1,000-2,000-token contexts reads ~88 GB of KV (~18 ms at
the H200's copy bandwidth) and does ~7 TFLOP of GEMMs (~9 ms): run one after the other the step costs their sum,
while the roofline bound is their maximum (issue 23; benchmarks/roofline.py).

Schedule. Rows [0, n) split into nano-batch A = [0, m) on the step's stream and B = [m, n) on a side stream
(m = n / 2 rounded down to a multiple of 8). Each runs the whole decoder on its rows (every op but attention is
row-wise). Their attention calls take turns: A's attention of layer l waits for B's attention of layer l - 1,
B's of layer l for A's of layer l (one CUDA event per call). So while one nano-batch reads its KV the other runs
its o_proj, MLP and next qkv_proj: per layer about max(attention, GEMMs) of one nano-batch twice, instead of
their sum for the whole batch. The turns are also what makes the split correct for speculative decode rows:
a request's k + 1 rows may straddle the boundary, and B's later rows read the KV that A's rows wrote in the same
layer, which B's attention waits for. Host order: layer by layer, A then B, so every event is recorded
(enqueued) before the wait that names it.

Cost: every weight matrix is read twice per step (once per nano-batch): +16 GB a step for llama-3.1-8b in bf16,
~3.3 ms at 4.8 TB/s, which pays only while each half's GEMMs stay compute-bound (M = 224 at batch 448 is just
above the H200's bf16 balance point, 989 TFLOP/s / 4.8 TB/s = ~206 rows; FP8 weights halve the extra bytes).
Nothing caps the SMs either kernel takes, so how much overlaps is the GPU block scheduler's doing: a measurement
decides
(scripts/gpu_fp8_check.sh steps 8-9 against 4 and 6 in the same call).

Inside CUDA graphs: the side stream forks from the capturing stream (`wait_stream`) and joins it before the
output is assembled, so the capture holds both branches and their event edges; the graph's memory pool serves
allocations of both streams (PyTorch's capture pools every stream that joined the capture). On the CPU (and in
an eager CUDA step, with streams too) the same code runs: on the CPU the nano-batches run one after the other
(no gain, only the tests' use: the split forward equals the plain one, and a recorder in place of the stream
operations checks the order of forks, joins, events and waits).

Applies (`NanoBatchForward.applies`): decode-only layouts (every sequence one query row: plain decodes and
speculative decode rows) of at least `min_decodes` (>= 16) rows, without cascade attention and without LoRA layers.
Not with tensor parallelism (the all-reduces would run on two streams): `check_supported`, called before any
rank starts.
"""

from __future__ import annotations

import contextlib

import torch

from shared_engine.model_executor.attention.metadata import AttentionMetadata

_ALIGN = 8  # nano-batch boundary: a multiple of this many rows (GEMM tiles; B's slices stay 16-byte aligned)
MIN_DECODES = 2 * _ALIGN  # the fewest rows a step may have to be split


def check_supported(config) -> None:
    """Raise `ValueError` when `config` (an EngineConfig) asks for nano-batches with tensor_parallel_size > 1."""
    if config.device.nano_batch_min_decodes and config.parallel.tensor_parallel_size > 1:
        raise ValueError("nano_batch_min_decodes needs tensor_parallel_size 1 (the nano-batches' all-reduces would "
                         "run on two streams)")


def split_point(num_rows: int) -> int:
    """Rows of nano-batch A for a step of `num_rows` >= 16 rows: half, rounded down to a multiple of 8."""
    if num_rows < MIN_DECODES:
        raise ValueError(f"a step of {num_rows} rows is too small to split (at least {MIN_DECODES})")
    return num_rows // 2 // _ALIGN * _ALIGN


def slice_decodes(meta: AttentionMetadata, start: int, end: int) -> AttentionMetadata:
    """The metadata of decode rows [start, end) of a decode-only layout (one query token per sequence)."""
    return AttentionMetadata(
        slot_mapping=meta.slot_mapping[start:end], block_tables=meta.block_tables[start:end],
        context_lens=meta.context_lens[start:end], cu_seqlens_q=meta.cu_seqlens_q[start : end + 1] - start,
        num_decodes=end - start, max_context_len=meta.max_context_len, max_query_len=1,
        context_lens_list=meta.context_lens_list[start:end], query_lens_list=meta.query_lens_list[start:end])


class CudaStreamOps:
    """The stream and event operations the schedule issues (a test passes a recorder with the same methods)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._side: torch.cuda.Stream | None = None

    def main(self):
        return torch.cuda.current_stream(self.device)

    def side(self):
        if self._side is None:
            self._side = torch.cuda.Stream(device=self.device)
        return self._side

    def on(self, stream):
        return torch.cuda.stream(stream)

    def wait_stream(self, waiter, other) -> None:
        waiter.wait_stream(other)

    def new_event(self):
        return torch.cuda.Event()

    def record(self, event) -> None:
        event.record()  # on the current stream

    def wait_event(self, event) -> None:
        torch.cuda.current_stream(self.device).wait_event(event)


class _SequentialOps:
    """No streams (the CPU): the nano-batches run one after the other, in the same order."""

    def main(self):
        return None

    side = main

    def on(self, stream):
        return contextlib.nullcontext()

    def wait_stream(self, waiter, other) -> None:
        pass

    def new_event(self):
        return None

    def record(self, event) -> None:
        pass

    def wait_event(self, event) -> None:
        pass


class _AttentionTurns:
    """Backends for the nano-batches whose attention calls run in turn: call g (layer g // P, nano-batch g % P)
    waits on the event recorded after call g - 1 (on the other stream)."""

    def __init__(self, backend, num_parts: int, events: list, ops) -> None:
        self.backend, self.num_parts, self.events, self.ops = backend, num_parts, events, ops
        self.calls = [0] * num_parts  # attention calls each nano-batch has made (its layer)

    def for_part(self, part: int) -> _TurnBackend:
        return _TurnBackend(self, part)

    def forward(self, part: int, *args, **kwargs) -> torch.Tensor:
        g = self.calls[part] * self.num_parts + part
        self.calls[part] += 1
        if g > 0:
            self.ops.wait_event(self.events[g - 1])
        out = self.backend.forward(*args, **kwargs)
        self.ops.record(self.events[g])
        return out


class _TurnBackend:
    def __init__(self, turns: _AttentionTurns, part: int) -> None:
        self.turns, self.part = turns, part

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.turns.forward(self.part, *args, **kwargs)


class NanoBatchForward:
    """`forward(input_ids [T], positions [T], kv_caches, meta, backend) -> hidden [T, hidden]`, like the
    model's own forward, for decode-only layouts (see the module docstring). `model` is a LlamaForCausalLM
    (`model.model.embed_tokens`, `.layers`, `.norm`). `min_decodes` >= 16: the fewest rows it applies to.
    `ops`: the stream operations (None: CUDA streams on a CUDA input, none on the CPU)."""

    def __init__(self, model, min_decodes: int, ops=None) -> None:
        if min_decodes < MIN_DECODES:
            raise ValueError(f"nano-batch overlap needs at least {MIN_DECODES} rows (two nano-batches of >= 8), "
                             f"got min_decodes={min_decodes}")
        self.model = model
        self.min_decodes = min_decodes
        self.ops = ops
        self._events: list = []  # one per attention call of a forward, made once (captures record their own use)
        self.steps = 0  # forwards run as nano-batches (captures and eager steps; graph replays are not counted)

    def applies(self, meta: AttentionMetadata, num_tokens: int, lora: bool = False) -> bool:
        """Decode-only (every sequence one row), at least `min_decodes` rows, no cascade, no LoRA layers."""
        return (not lora and not meta.use_cascade and meta.num_decodes == meta.num_seqs == num_tokens
                and num_tokens >= self.min_decodes)

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_caches: list[torch.Tensor],
                 meta: AttentionMetadata, backend) -> torch.Tensor:
        n = input_ids.shape[0]
        m = split_point(n)
        bounds = ((0, m), (m, n))
        metas = [slice_decodes(meta, a, b) for a, b in bounds]
        if self.ops is None:
            self.ops = CudaStreamOps(input_ids.device) if input_ids.is_cuda else _SequentialOps()
        ops = self.ops
        inner = self.model.model
        calls = len(bounds) * len(inner.layers)
        if len(self._events) < calls:
            self._events = [ops.new_event() for _ in range(calls)]
        streams = (ops.main(), ops.side())
        ops.wait_stream(streams[1], streams[0])  # fork: the side stream sees the step's inputs
        turns = _AttentionTurns(backend, len(bounds), self._events, ops)
        states = []
        for part, (a, b) in enumerate(bounds):
            with ops.on(streams[part]):
                states.append((inner.embed_tokens(input_ids[a:b]), None))
        for layer, kv_cache in zip(inner.layers, kv_caches):
            for part, (a, b) in enumerate(bounds):
                with ops.on(streams[part]):
                    hidden, residual = states[part]
                    states[part] = layer(positions[a:b], hidden, residual, kv_cache, metas[part], turns.for_part(part))
        outs = []
        for part in range(len(bounds)):
            with ops.on(streams[part]):
                outs.append(inner.norm(*states[part])[0])
        ops.wait_stream(streams[0], streams[1])  # join: B's rows are done before anyone reads them
        self.steps += 1
        return torch.cat(outs)

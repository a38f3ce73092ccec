"""`CudaGraphRunner`: decode-only steps and small mixed (prefill + decode) steps replayed from CUDA graphs.

Why: a step launches hundreds of small kernels; eagerly each costs about 10 µs of launch overhead on an
H200, inside a graph about 1 µs (measured there, see the project notes). An eager llama-3.1-8b step
spends ~14 ms on the host whatever its size (scripts/profile_eager_step.py), so every step that carries
a prefill chunk used to cost 22-35 ms against 6-9 ms for a graphed decode step, and inter-token latency
under load was set by those steps (benchmarks/results/rag_case_h200_*).

Two kinds of graph share one memory pool and one set of static input buffers:
- decode graphs, one per batch size in `decode_sizes`: n decodes replay the smallest graph of size >= n;
- mixed graphs, one per (decode bucket D, prefill-token bucket T) from `mixed_decode_sizes` x
  `mixed_prefill_sizes`, each with room for `max_prefill_seqs` prefill sequences. A step with nd decodes
  and tp prefill tokens in p <= max_prefill_seqs chunks replays the smallest (D >= nd, T >= tp).

Padded layout of a mixed graph (tokens and sequences): rows [0, nd) are the decodes, [nd, D) padding
decodes (slot -1: no KV write; context 1 over whatever block the stale table row names, always a valid
block); token rows [D, D + tp) are the prefill chunks, [D + tp, D + T) padding (slot -1, belong to no
sequence); sequence rows [D, D + p) the chunks, [D + p, D + max_prefill_seqs) empty (query length 0, so
the prefill kernel's programs exit at once). Padding rows compute garbage that no real row reads: every
op but attention is row-wise, and attention reads only the cache, which padding never writes.

Cascade variants: with `enable_cascade`, every decode and mixed graph whose decode bucket is at least
CASCADE_MIN_DECODES is captured twice, plain and cascade (key `(D, T, True)`), the latter running the
decode part through the shared-prefix kernel on two more static buffers, `prefix_len` and `prefix_blocks`
(room for a whole `max_model_len` context), which `run` fills from the step's metadata. A cascade step
always has nd >= CASCADE_MIN_DECODES, so its bucket D has a cascade variant. Padding decode rows (context 1)
then fall short of the prefix (their context < prefix_len, outside the kernel's contract) and stay
harmless: the prefix kernel scores their rows against this step's prefix, real blocks, and the suffix
kernel finds their suffix [prefix_len, 1) empty, so they read only valid blocks and write only their own
(finite, garbage) partial and output rows. Capture runs with prefix_len 0: the suffix kernel alone.

Varlen graphs, for speculative steps of more than `max_prefill_seqs` requests (each query length k + 1): one
per (S sequences, T = S * (k + 1) tokens) from `varlen_buckets`, key `(-S, T, False, lora)`. There is no
decode part: every sequence of the step, its plain decodes too (query length 1), goes through the varlen
prefill kernel, whose grid is captured for `varlen_max_query_len` = k + 1 query tokens per sequence; rows
past the step's tokens are padding (slot -1, in no sequence), sequences past its own have query length 0.
A step fits when its sequences <= S, tokens <= T and longest query <= k + 1 (no longer prefill chunk), and
no mixed graph fits it.

LoRA (`lora_ctx`, a LoRAContext): every graph is captured with the LoRA layers (key `(D, T, cascade,
True)`), reading the context's fixed slot buffers, which the model runner fills in the graph's padded row
layout (`pad_rows`: padding rows slot -1, so they add nothing). Decode graphs are also captured without
them (`(D, 0, cascade, False)`): a decode step with no adapter token replays that one, at the base model's
cost. Any step may replay a graph with the layers (a step without adapters then adds exact zeros), so a
missing base-only variant costs time, never correctness. Decode graphs also get an attention-only LoRA
variant (`(D, 0, cascade, LORA_ATTENTION)`, layers/lora.py: the q/k/v and o LoRA, no MLP launches), which a
decode step whose adapters target only attention projections replays. Without LoRA every key ends in False.
"""

from __future__ import annotations

import numpy as np
import torch

from shared_engine.model_executor.attention.cascade import CASCADE_MIN_DECODES
from shared_engine.model_executor.attention.metadata import AttentionMetadata
from shared_engine.model_executor.layers.lora import LORA_ALL, LORA_ATTENTION, LORA_NONE

# Prefill-token buckets for mixed graphs; beyond the largest a step is compute-bound and runs eagerly.
PREFILL_TOKEN_BUCKETS = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
DECODE_BUCKETS = (0, 8, 16, 24, 32, 48, 64, 128, 256, 512)
MAX_PREFILL_SEQS = 8
# sequence buckets of varlen graphs (speculative steps beyond MAX_PREFILL_SEQS requests)
VARLEN_SEQ_BUCKETS = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
_TOKEN_ALIGN = 16


def varlen_buckets(max_num_seqs: int, num_speculative_tokens: int, max_prefill_seqs: int) -> list[tuple[int, int]]:
    """(S sequences, T tokens) of the varlen graphs for speculative steps with k = `num_speculative_tokens`:
    every S from VARLEN_SEQ_BUCKETS above `max_prefill_seqs` (fewer ride the mixed graphs) and below
    `max_num_seqs`, then `max_num_seqs` itself; T = S * (k + 1). [] without speculation (k = 0)."""
    if num_speculative_tokens <= 0 or max_num_seqs <= max_prefill_seqs:
        return []
    seqs = [s for s in VARLEN_SEQ_BUCKETS if max_prefill_seqs < s < max_num_seqs] + [max_num_seqs]
    return [(s, s * (num_speculative_tokens + 1)) for s in seqs]


def is_varlen(key: tuple) -> bool:
    return key[0] < 0


def _num_tokens(key: tuple) -> int:
    """Token rows of a graph's layout."""
    return key[1] if key[0] < 0 else key[0] + key[1]


def mixed_buckets(max_num_seqs: int, max_prefill_tokens: int) -> tuple[list[int], list[int]]:
    """(decode buckets, prefill-token buckets) for mixed graphs: every decode count up to `max_num_seqs`
    and every prefill-token count up to `max_prefill_tokens` fits one bucket. ([], []) when the latter is 0."""
    if max_prefill_tokens <= 0:
        return [], []
    decode = [d for d in DECODE_BUCKETS if d < max_num_seqs] + [max_num_seqs]
    prefill = [t for t in PREFILL_TOKEN_BUCKETS if t < max_prefill_tokens] + [max_prefill_tokens]
    return decode, prefill


def budget_filling_sizes(decode_buckets: list[int], token_budget: int, max_prefill_tokens: int
                         ) -> list[tuple[int, int]]:
    """Extra mixed graphs (D, T) for the steps a loaded server runs most: decodes plus a prefill chunk that
    fills the token budget. nd decodes (prev < nd <= D, prev the next smaller decode bucket) leave at most
    budget - prev - 1 prefill tokens, so T = that, rounded up to 16, fits every such step with fewer padded
    rows than the cross product's next bucket. Example: budget 512, 60 decodes + 452 prefill tokens replays
    (64, 464) = 528 rows instead of (64, 512) = 576, 8% fewer rows through every GEMM."""
    sizes = []
    for prev, d in zip(decode_buckets, decode_buckets[1:]):
        t = -(-(token_budget - prev - 1) // _TOKEN_ALIGN) * _TOKEN_ALIGN
        if 0 < t <= max_prefill_tokens:
            sizes.append((d, t))
    return sizes


class CudaGraphRunner:
    varlen_sizes: list[tuple[int, int]] = []  # (S sequences, T tokens), smallest first; set by `_layout`
    varlen_max_query_len = 0

    def __init__(self, model, kv_caches, backend, *, decode_sizes: list[int], mixed_decode_sizes: list[int],
                 mixed_prefill_sizes: list[int], max_prefill_seqs: int, max_blocks_per_seq: int,
                 max_model_len: int, device: torch.device, enable_cascade: bool = False,
                 extra_mixed_sizes: list[tuple[int, int]] = (), lora_ctx=None,
                 varlen_sizes: list[tuple[int, int]] = (), varlen_max_query_len: int = 0,
                 nano_forward=None) -> None:
        """`nano_forward` (a NanoBatchForward, or None): the decode graphs whose layout it applies to are captured
        running it (two overlapped nano-batches; keys in `nano_keys`), the others running `model`."""
        self.nano_keys: set[tuple] = set()
        self._layout(decode_sizes, mixed_decode_sizes, mixed_prefill_sizes, max_prefill_seqs, max_blocks_per_seq,
                     max_model_len, device, extra_mixed_sizes, varlen_sizes, varlen_max_query_len)
        pool = None
        keys = self.keys(enable_cascade, lora_ctx is not None)
        for key in sorted(keys, key=lambda k: (_num_tokens(k), k[1], k[2], k[3]), reverse=True):  # largest first
            self._reset_padding(*key[:2])
            meta = self._meta(*key[:3])
            tokens = _num_tokens(key)
            args = (self.input_ids[:tokens], self.positions[:tokens], kv_caches, meta, backend)
            if lora_ctx is not None:
                lora_ctx.use_variant(key[3])
            forward = model
            if nano_forward is not None and nano_forward.applies(meta, tokens, lora=bool(key[3])):
                forward = nano_forward
                self.nano_keys.add(key)
            forward(*args)  # warm-up: Triton JIT and allocator
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[key] = forward(*args)
            pool = graph.pool()
            self.graphs[key] = graph
        torch.cuda.synchronize(device)

    def _layout(self, decode_sizes, mixed_decode_sizes, mixed_prefill_sizes, max_prefill_seqs, max_blocks_per_seq,
                max_model_len, device, extra_mixed_sizes=(), varlen_sizes=(), varlen_max_query_len=0) -> None:
        """The buckets and the static input buffers (no capture: also on the CPU, for tests)."""
        self.decode_sizes = sorted(decode_sizes)
        self.mixed_decode_sizes = sorted(mixed_decode_sizes)
        self.mixed_prefill_sizes = sorted(mixed_prefill_sizes)
        # (D, T) pairs beyond the cross product (budget_filling_sizes), only with mixed graphs
        self.extra_mixed_sizes = sorted(set(extra_mixed_sizes)) if self.mixed_prefill_sizes else []
        self.max_prefill_seqs = max_prefill_seqs if self.mixed_prefill_sizes else 0
        max_tokens = max(self.decode_sizes or [0])
        max_seqs = max_tokens
        if self.mixed_prefill_sizes:
            max_tokens = max(max_tokens, self.mixed_decode_sizes[-1] + self.mixed_prefill_sizes[-1],
                             *(d + t for d, t in self.extra_mixed_sizes))
            max_seqs = max(max_seqs, self.mixed_decode_sizes[-1] + self.max_prefill_seqs)
        self.varlen_sizes = sorted(set(varlen_sizes)) if varlen_max_query_len > 0 else []
        self.varlen_max_query_len = varlen_max_query_len
        if self.varlen_sizes:
            max_tokens = max(max_tokens, *(t for _, t in self.varlen_sizes))
            max_seqs = max(max_seqs, *(s for s, _ in self.varlen_sizes))
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(max_seqs, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(max_seqs, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.zeros(max_seqs + 1, dtype=torch.int32, device=device)
        self.prefix_len = torch.zeros(1, dtype=torch.int32, device=device)  # [1] tokens
        self.prefix_blocks = torch.zeros(max_blocks_per_seq, dtype=torch.int32, device=device)
        self.max_model_len = max_model_len
        # (decodes, prefill tokens, cascade, LoRA layers) → graph
        self.graphs: dict[tuple[int, int, bool, bool], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int, bool, bool], torch.Tensor] = {}

    def keys(self, enable_cascade: bool = False, lora: bool = False) -> list[tuple[int, int, bool, bool]]:
        """Every graph to capture: (decodes, prefill tokens, cascade, LoRA layers), varlen ones (-S, T, ...)."""
        sizes = [(bs, 0) for bs in self.decode_sizes]
        sizes += [(d, t) for d in self.mixed_decode_sizes for t in self.mixed_prefill_sizes]
        sizes += [size for size in self.extra_mixed_sizes if size not in sizes]
        keys = [(d, t, False) for d, t in sizes]
        keys += [(d, t, True) for d, t in sizes if enable_cascade and d >= CASCADE_MIN_DECODES]
        keys += [(-s, t, False) for s, t in self.varlen_sizes]
        keys = [(*k, lora) for k in keys]
        if lora:  # decode graphs without the LoRA layers (no adapter token) and with attention LoRA only
            decode = [(d, t, c) for d, t, c, _ in keys if t == 0]
            keys += [(*k, False) for k in decode] + [(*k, LORA_ATTENTION) for k in decode]
        return keys

    def _meta(self, decodes: int, prefill_tokens: int, cascade: bool) -> AttentionMetadata:
        if decodes < 0:  # varlen: -decodes sequences, all through the prefill kernel
            seqs = -decodes
            return AttentionMetadata(
                slot_mapping=self.slot_mapping[:prefill_tokens], block_tables=self.block_tables[:seqs],
                context_lens=self.context_lens[:seqs], cu_seqlens_q=self.cu_seqlens_q[: seqs + 1], num_decodes=0,
                max_context_len=self.max_model_len, max_query_len=self.varlen_max_query_len,
                context_lens_list=[0] * seqs, query_lens_list=[0] * seqs)
        seqs = decodes + (self.max_prefill_seqs if prefill_tokens else 0)
        tokens = decodes + prefill_tokens
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:tokens], block_tables=self.block_tables[:seqs],
            context_lens=self.context_lens[:seqs], cu_seqlens_q=self.cu_seqlens_q[: seqs + 1],
            num_decodes=decodes, max_context_len=self.max_model_len, max_query_len=max(1, prefill_tokens),
            context_lens_list=[1] * seqs, query_lens_list=[1] * decodes + [0] * (seqs - decodes),
        )
        if cascade:
            meta.prefix_len, meta.prefix_blocks = self.prefix_len, self.prefix_blocks
            # prefix splits sized for a prefix as long as the model's context, like the decode splits
            meta.max_prefix_len = self.max_model_len
        return meta

    def _reset_padding(self, decodes: int, prefill_tokens: int) -> None:
        """Every row of the layout a padding row (used for capture): nothing written, nothing to attend."""
        if decodes < 0:
            self.slot_mapping[:prefill_tokens].fill_(-1)
            self.context_lens[:-decodes].fill_(0)
            self.cu_seqlens_q[: -decodes + 1].fill_(0)
            return
        self.slot_mapping[: decodes + prefill_tokens].fill_(-1)
        self.context_lens[:decodes].fill_(1)
        self.prefix_len.fill_(0)
        if prefill_tokens:
            self.context_lens[decodes : decodes + self.max_prefill_seqs].fill_(0)
            self.cu_seqlens_q[decodes : decodes + self.max_prefill_seqs + 1].fill_(decodes)

    def spec_step_padding(self) -> tuple[int, int, int] | None:
        """How speculative steps run (None without varlen graphs): (the most speculative decodes a step runs in
        a mixed graph; the draft tokens every sequence of a wider speculative step is padded to, in a varlen
        graph; the most rows of a decode graph). A step of decodes only whose tokens fit the last runs as decode
        rows (input_builder.decode_rows), unpadded, whatever its number of speculative decodes."""
        if not self.varlen_sizes:
            return None
        return self.max_prefill_seqs, self.varlen_max_query_len - 1, self.decode_sizes[-1] if self.decode_sizes else 0

    def select(self, meta: AttentionMetadata, num_tokens: int, lora_active: int = False
               ) -> tuple[int, int, bool, int] | None:
        """The graph (decode bucket, prefill-token bucket, cascade, LoRA variant) this step's layout fits,
        or None (run eagerly). A cascade step replays its bucket's cascade variant; should that be missing,
        the plain variant, which is correct for any layout. `lora_active` is the LoRA variant the step needs
        (layers/lora.py; False / True mean none / all): a step with no adapter token replays the base-only
        variant where there is one, one whose adapters target only attention projections the
        attention-only variant; otherwise, and where those are missing, the variant with every LoRA layer
        (a superset: correct for any step)."""
        bucket = self._bucket(meta, num_tokens)
        if bucket is None:
            return None
        variants = (LORA_NONE, LORA_ALL, LORA_ATTENTION)
        cascade = meta.use_cascade and any((*bucket, True, v) in self.graphs for v in variants)
        if not lora_active:
            order = (LORA_NONE, LORA_ATTENTION, LORA_ALL)
        elif lora_active == LORA_ATTENTION:
            order = (LORA_ATTENTION, LORA_ALL)
        else:
            order = (LORA_ALL,)
        for variant in order:
            if (*bucket, cascade, variant) in self.graphs:
                return (*bucket, cascade, variant)
        return (*bucket, False, (*bucket, False, True) in self.graphs)

    @staticmethod
    def pad_rows(key: tuple[int, int, bool, bool], num_decodes: int, values: np.ndarray, fill: int) -> np.ndarray:
        """Per-token `values` [num_tokens] (the step's order: decodes, then prefill tokens) in graph `key`'s
        rows: decodes at [0, nd), prefill tokens from D on, `fill` in the padding between (rows past the
        end are the caller's to fill). Decode graphs: `values` as they are."""
        d, t = key[0], key[1]
        if t == 0 or num_decodes == d or d < 0:  # varlen graphs: the step's own order
            return values
        tp = values.shape[0] - num_decodes
        rows = np.full(d + tp, fill, dtype=values.dtype)
        rows[:num_decodes] = values[:num_decodes]
        rows[d:] = values[num_decodes:]
        return rows

    def _bucket(self, meta: AttentionMetadata, num_tokens: int) -> tuple[int, int] | None:
        nd, num_seqs = meta.num_decodes, meta.num_seqs
        if meta.block_tables.shape[1] > self.block_tables.shape[1]:
            return None
        if nd == num_seqs:
            if nd != num_tokens:
                return None
            bs = next((s for s in self.decode_sizes if s >= nd), None)
            if bs is not None:
                return (bs, 0)
        prefill_tokens = num_tokens - nd
        if num_seqs - nd <= self.max_prefill_seqs:
            d = next((s for s in self.mixed_decode_sizes if s >= nd), None)
            t = next((s for s in self.mixed_prefill_sizes if s >= prefill_tokens), None)
            fits = [(d, t)] if d is not None and t is not None else []
            fits += [(ed, et) for ed, et in self.extra_mixed_sizes if ed >= nd and et >= prefill_tokens]
            if fits:
                return min(fits, key=lambda size: (size[0] + size[1], size[1]))  # fewest padded rows
        if meta.max_query_len <= self.varlen_max_query_len:  # a speculative step beyond the mixed graphs
            return next(((-s, t) for s, t in self.varlen_sizes if s >= num_seqs and t >= num_tokens), None)
        return None

    @torch.inference_mode()
    def run(self, key: tuple[int, int, bool, bool], input_ids: torch.Tensor, positions: torch.Tensor,
            meta: AttentionMetadata) -> torch.Tensor:
        """Replay graph `key` (from `select`) for this step; returns hidden states in the step's own
        (unpadded) token order, `[num_tokens, hidden]`."""
        d, t, cascade, _ = key
        if d < 0:
            self._fill_varlen(key, input_ids, positions, meta)
            self.graphs[key].replay()
            return self.outputs[key][: input_ids.shape[0]]
        nd, n = meta.num_decodes, input_ids.shape[0]
        width = meta.block_tables.shape[1]
        self.input_ids[:nd].copy_(input_ids[:nd])
        self.positions[:nd].copy_(positions[:nd])
        self.slot_mapping[:nd].copy_(meta.slot_mapping[:nd])
        self.slot_mapping[nd:d].fill_(-1)
        self.context_lens[:nd].copy_(meta.context_lens[:nd])
        self.context_lens[nd:d].fill_(1)
        self.block_tables[:nd, :width].copy_(meta.block_tables[:nd])
        if cascade:  # entries past prefix_len // block_size stay stale: the kernel never reads them
            self.prefix_len.copy_(meta.prefix_len)
            self.prefix_blocks[: meta.prefix_blocks.shape[0]].copy_(meta.prefix_blocks)
        if t == 0:
            self.graphs[key].replay()
            return self.outputs[key][:nd]
        tp, p = n - nd, meta.num_seqs - nd
        self.input_ids[d : d + tp].copy_(input_ids[nd:])
        self.positions[d : d + tp].copy_(positions[nd:])
        self.slot_mapping[d : d + tp].copy_(meta.slot_mapping[nd:])
        self.slot_mapping[d + tp : d + t].fill_(-1)
        self.context_lens[d : d + p].copy_(meta.context_lens[nd:])
        self.context_lens[d + p : d + self.max_prefill_seqs].fill_(0)
        self.block_tables[d : d + p, :width].copy_(meta.block_tables[nd:])
        # prefill sequence j starts at token d + (cu[nd + j] - nd); empty sequences after the last chunk
        self.cu_seqlens_q[d : d + p + 1].copy_(meta.cu_seqlens_q[nd:] + (d - nd))
        self.cu_seqlens_q[d + p + 1 : d + self.max_prefill_seqs + 1].fill_(d + tp)
        self.graphs[key].replay()
        out = self.outputs[key]
        if nd == d:
            return out[: d + tp]
        return torch.cat((out[:nd], out[d : d + tp]))

    def _fill_varlen(self, key: tuple, input_ids: torch.Tensor, positions: torch.Tensor,
                     meta: AttentionMetadata) -> None:
        """The static buffers for a varlen graph `(-S, T, ...)`: the step's tokens at rows [0, n), padding to T
        (slot -1), its sequences (decodes included) at rows [0, num_seqs), empty ones (query length 0) to S."""
        s, t = -key[0], key[1]
        n, seqs, width = input_ids.shape[0], meta.num_seqs, meta.block_tables.shape[1]
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:t].fill_(-1)
        self.context_lens[:seqs].copy_(meta.context_lens)
        self.context_lens[seqs:s].fill_(0)
        self.block_tables[:seqs, :width].copy_(meta.block_tables)
        self.cu_seqlens_q[: seqs + 1].copy_(meta.cu_seqlens_q)
        self.cu_seqlens_q[seqs + 1 : s + 1].fill_(n)

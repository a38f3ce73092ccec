"""`CudaGraphRunner`: decode-only steps replayed from CUDA graphs.

A decode step launches hundreds of small kernels; eagerly each costs about 10 µs of launch overhead on an
H200, inside a graph about 1 µs (measured there, see the project notes). Graphs are captured once per batch
size in `cuda_graph_sizes` over static input buffers; a step with n decodes copies its inputs into the
buffers and replays the smallest captured graph of size >= n. Padding rows write nothing (slot -1) and
attend to one token of block 0.
"""

from __future__ import annotations

import torch

from shared_engine.model_executor.attention.metadata import AttentionMetadata


class CudaGraphRunner:
    def __init__(self, model, kv_caches, backend, batch_sizes: list[int], max_blocks_per_seq: int,
                 max_model_len: int, device: torch.device) -> None:
        self.batch_sizes = sorted(batch_sizes)
        max_bs = self.batch_sizes[-1]
        self.input_ids = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((max_bs,), -1, dtype=torch.int64, device=device)
        self.block_tables = torch.zeros(max_bs, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.context_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.cu_seqlens_q = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.max_model_len = max_model_len
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        pool = None
        for bs in reversed(self.batch_sizes):  # largest first, so smaller graphs reuse its memory pool
            meta = self._meta(bs)
            args = (self.input_ids[:bs], self.positions[:bs], kv_caches, meta, backend)
            model(*args)  # warm-up: Triton JIT and allocator
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = model(*args)
            pool = graph.pool()
            self.graphs[bs] = graph
        torch.cuda.synchronize(device)

    def _meta(self, bs: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bs], block_tables=self.block_tables[:bs],
            context_lens=self.context_lens[:bs], cu_seqlens_q=self.cu_seqlens_q[: bs + 1], num_decodes=bs,
            max_context_len=self.max_model_len, max_query_len=1, context_lens_list=[1] * bs,
            query_lens_list=[1] * bs,
        )

    def can_run(self, meta: AttentionMetadata, num_tokens: int) -> bool:
        return (meta.num_decodes == meta.num_seqs == num_tokens and num_tokens <= self.batch_sizes[-1]
                and meta.block_tables.shape[1] <= self.block_tables.shape[1])

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        n = input_ids.shape[0]
        bs = next(size for size in self.batch_sizes if size >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:bs].fill_(-1)
        self.context_lens[:n].copy_(meta.context_lens)
        self.context_lens[n:bs].fill_(1)
        self.block_tables[:n, : meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]

"""`TPCommModel`: the collectives of one tensor-parallel step, in seconds, and its calibration.

A step of the engine at TP = N runs, per rank (shared_engine/distributed/, model_executor/layers/):
- one all-reduce of the hidden states after every attention block and every MLP block, and one after the
  vocabulary-parallel embedding: `2 * num_layers + 1` all-reduces of `num_tokens * hidden * dtype bytes`;
- one all-gather of the sampled rows' logits: `num_sampled * padded vocab * dtype bytes` in total.

Each collective costs a fixed latency plus its bytes over the bus bandwidth, with the ring algorithm's
traffic (Patarasuk & Yuan 2009; NCCL's "bus bandwidth", nccl-tests doc/PERFORMANCE.md): an all-reduce moves
`2 (N - 1) / N` of its bytes through each link, an all-gather `(N - 1) / N`:

    t_allreduce(b) = latency + 2 (N - 1) / N * b / bus_bandwidth
    t_allgather(b) = latency + (N - 1) / N * b / bus_bandwidth

`latency` and `bus_bandwidth` are the hardware profile's `allreduce_latency_s` and `allreduce_bandwidth`.
For the H200 they are assumptions until a run on two H200s measures them (scripts/tp_gpu_bench.sh, then
`fit` below on its TP=2 step times): the datasheet's NVLink bandwidth per direction and a latency typical of
a small NCCL all-reduce inside one node; the hardware profile says so in `allreduce_source`.

`fit` calibrates both from measured steps: each measured TP step minus the model's compute-only prediction
for the same step is the collectives' time, linear in (latency, 1 / bus_bandwidth) over the step's
collectives, solved by least squares (batch-1 decode steps pin the latency, large prefill steps the
bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared_engine.distributed.partition import padded_vocab_size
from shared_engine.model_arch import DTYPE_BYTES, ModelArch


@dataclass(frozen=True)
class TPCommModel:
    tensor_parallel_size: int
    latency_s: float  # per collective
    bus_bandwidth: float  # bytes/s through each rank's link (NCCL's busbw)
    num_allreduces: int  # per step: 2 per layer + the embedding's
    allreduce_bytes_per_token: float  # hidden * dtype bytes
    allgather_bytes_per_sample: float  # padded vocab * dtype bytes

    @classmethod
    def for_model(cls, arch: ModelArch, dtype: str, tp: int, latency_s: float, bus_bandwidth: float) -> TPCommModel:
        size = DTYPE_BYTES[dtype]
        return cls(tp, latency_s, bus_bandwidth, 2 * arch.num_layers + 1, arch.hidden_size * size,
                   padded_vocab_size(arch.vocab_size, tp) * size)

    def terms(self, num_tokens: float, num_sampled: float) -> tuple[float, float]:
        """(number of collectives, bus bytes) of one step: seconds = n * latency + bytes / bus_bandwidth."""
        if self.tensor_parallel_size == 1:
            return 0.0, 0.0
        ring = (self.tensor_parallel_size - 1) / self.tensor_parallel_size
        bus = 2 * ring * self.num_allreduces * self.allreduce_bytes_per_token * num_tokens
        bus += ring * self.allgather_bytes_per_sample * num_sampled
        return self.num_allreduces + (1 if num_sampled else 0), bus

    def seconds(self, num_tokens: float, num_sampled: float) -> float:
        count, bus = self.terms(num_tokens, num_sampled)
        return count * self.latency_s + bus / self.bus_bandwidth


def fit(model: TPCommModel, steps: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(latency_s, bus_bandwidth) from measured steps `(num_tokens, num_sampled, comm_seconds)`, where
    comm_seconds is a measured TP step's time minus the step-time model's compute-only prediction for it.
    Least squares on `comm = count * latency + bus_bytes * (1 / bandwidth)`, each clipped at zero.

    Raises:
        ValueError: fewer than two steps, or steps that cannot separate latency from bandwidth (all the
            same size).
    """
    import numpy as np

    if len(steps) < 2:
        raise ValueError("fit needs at least two measured steps (e.g. a batch-1 decode and a prefill)")
    rows = [model.terms(n, s) for n, s, _ in steps]
    a = np.array(rows, dtype=np.float64)
    b = np.array([c for _, _, c in steps], dtype=np.float64)
    if np.linalg.matrix_rank(a) < 2:
        raise ValueError("the steps are all the same shape: latency and bandwidth cannot be told apart")
    (latency, inv_bw), *_ = np.linalg.lstsq(a, b, rcond=None)
    return max(0.0, float(latency)), (float("inf") if inv_bw <= 0 else float(1.0 / inv_bw))

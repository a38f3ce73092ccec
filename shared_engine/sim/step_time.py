"""`StepTimeModel`: seconds one engine step takes, from the step's contents (a roofline).

For a step whose scheduled requests each compute `n` new tokens at positions `[s, s + n)`:

    bytes  = weight bytes (every layer + LM head, read once per step)
           + KV bytes per token * sum(s + n)          (attention reads each request's whole context)
           + KV bytes per token * sum(n)              (the new tokens' K/V are written)
    FLOPs  = 2 * body parameters * sum(n)              (every matmul in the layers, per token)
           + 2 * vocab * hidden * num_sampled          (LM head, only for tokens that sample)
           + 4 * layers * heads * head_dim * sum(n*s + n(n+1)/2)   (QK^T and PV, causal in the chunk)
    device = device_step_overhead + device_per_seq_overhead * num_seqs + body
    host   = step_overhead + per_seq_overhead * num_seqs
    time   = host + device (the synchronous step), or max(host, device) with async scheduling (`overlap_host`),
             where body is, by the profile's rule:
      phases (GPUs): max(weight bytes / bandwidth, matmul FLOPs / matmul rate)
                     + max(KV bytes / bandwidth, attention FLOPs / attention rate)
      max:           max(bytes / bandwidth, matmul FLOPs / matmul rate + attention FLOPs / attention rate)
      sum (the CPU): bytes / bandwidth + matmul FLOPs / matmul rate + attention FLOPs / attention rate

`phases` is a roofline per phase: a step's kernels run one after another, so the GEMMs (bound by the weight
stream or, with a prefill chunk, by compute) and attention (bound by the KV read) do not overlap each other.
A single roofline over the whole step (`max`) lets a mixed step's compute-bound GEMMs hide its memory-bound
decode attention: on the H200 it predicted the case_rag_chatbot step (60 decodes at ~5.7k context + a
452-token chunk, llama-3.1-8b) at ~18 ms, where the step alone measured 24 ms
(benchmarks/results/profile_rag_step_h200.json).

The host overheads are the host's share of a step (scheduling, input building, launches, output processing)
and the device overheads the GPU's time beyond the roofline (sampling, norms, small kernels), fitted apart
from synchronous steps whose GPU span was recorded (`calibration.py`). With async scheduling (the engine's
default on CUDA) the host prepares step n+1 while the device runs step n, so a step takes the longer of the
two (`overlap_host`); the default prices their sum (the synchronous step), which is conservative. A profile
without GPU spans folds the device overheads into the host's, and then the longer of the two overstates
what async scheduling gains (benchmarks/results/sim_fidelity_h200.json states both on the H200 runs).

The attention rate is the matmul peak times its own achieved fraction (on a GPU the same as the matmuls'
unless a profile says otherwise; on the CPU the masked SDPA path runs far below the matmul rate).

Tensor parallelism (`tensor_parallel_size` N > 1): every quantity above is the busiest rank's share (its
query and KV heads, `ceil(intermediate / N)` MLP columns, `padded vocab / N` LM-head rows: see
distributed/partition.py), and the device time adds the step's collectives (`tp_comm.py`: 2 all-reduces
per layer and one for the embedding, the logits' all-gather), which run between the kernels, not beside
them. Their latency and bandwidth come from the hardware profile (`allreduce_latency_s`,
`allreduce_bandwidth`); for the H200 they are assumptions until a run on two GPUs calibrates them.

The roofline is Williams, Waterman & Patterson, "Roofline" (CACM 2009); the per-token FLOP count is the
2N rule of Kaplan et al. 2020 ("Scaling Laws", table 1) split into body and head; KV bytes per token come
from `ModelArch.kv_bytes_per_token`. The achieved fractions and overheads are the hardware profile's
(measured on the H200, fitted from a recorded step profile on a CPU: see `calibration.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared_engine.distributed.partition import head_partition, max_local_kv_heads, padded_vocab_size
from shared_engine.model_arch import DTYPE_BYTES, ModelArch
from shared_engine.sim.hardware import HardwareProfile
from shared_engine.sim.tp_comm import TPCommModel


@dataclass(frozen=True)
class StepShape:
    """Constants of the model needed per step, in bytes and FLOPs."""

    weight_bytes: float  # read once per step: layers + final norm + LM head
    kv_bytes_per_token: float
    body_flops_per_token: float  # 2 * parameters in the decoder layers
    head_flops_per_sample: float  # 2 * vocab * hidden
    attn_flops_per_pair: float  # 4 * layers * heads * head_dim, per (query, key) pair

    @classmethod
    def from_arch(cls, arch: ModelArch, dtype: str, tensor_parallel_size: int = 1,
                  kv_cache_dtype: str | None = None) -> StepShape:
        """The whole model at TP=1; the busiest rank's share at TP=N (see the module docstring). KV bytes in
        `kv_cache_dtype` ("fp8": 1 byte per element; default `dtype`)."""
        size, tp = DTYPE_BYTES[dtype], tensor_parallel_size
        h = arch.hidden_size
        if tp == 1:
            head = arch.vocab_size * h
            embed = head * (1 if arch.tie_word_embeddings else 2)
            body = arch.num_parameters - embed - h  # decoder layers only
            heads, kv_per_token = arch.num_heads, arch.kv_bytes_per_token(kv_cache_dtype or dtype)
        else:
            heads = max(head_partition(arch.num_heads, arch.num_kv_heads, tp, r).num_heads for r in range(tp))
            kv_heads = max_local_kv_heads(arch.num_heads, arch.num_kv_heads, tp)
            d, columns = arch.head_dim, -(-arch.intermediate_size // tp)
            body = arch.num_layers * (h * d * (heads + 2 * kv_heads) + heads * d * h + 3 * h * columns + 2 * h)
            head = padded_vocab_size(arch.vocab_size, tp) // tp * h
            kv_per_token = arch.kv_bytes_per_token(kv_cache_dtype or dtype) * kv_heads // arch.num_kv_heads
        return cls(
            weight_bytes=(body + h + head) * size,
            kv_bytes_per_token=kv_per_token,
            body_flops_per_token=2.0 * body,
            head_flops_per_sample=2.0 * head,
            attn_flops_per_pair=4.0 * arch.num_layers * heads * arch.head_dim,
        )

    def bytes_and_flops(self, num_tokens: float, num_sampled: float, ctx_tokens: float, attn_pairs: float):
        """(bytes moved, matmul FLOPs, attention FLOPs) for a step with these totals (scalars or arrays)."""
        moved = self.weight_bytes + self.kv_bytes_per_token * (ctx_tokens + num_tokens)
        matmul = self.body_flops_per_token * num_tokens + self.head_flops_per_sample * num_sampled
        return moved, matmul, self.attn_flops_per_pair * attn_pairs


def item_totals(items) -> tuple[int, int, int, int, int]:
    """(num_seqs, num_tokens, num_sampled, ctx_tokens, attn_pairs) from `(start, n, needs_sample)` items."""
    num_tokens = num_sampled = ctx = pairs = 0
    for start, n, sample in items:
        num_tokens += n
        num_sampled += sample
        ctx += start + n
        pairs += n * start + n * (n + 1) // 2
    return len(items), num_tokens, num_sampled, ctx, pairs


class StepTimeModel:
    """Step seconds for one model on one device. `seconds(scheduled)` is the simulator's hot path."""

    def __init__(self, arch: ModelArch, dtype: str, hardware: HardwareProfile, overlap_host: bool = False,
                 tensor_parallel_size: int = 1, kv_cache_dtype: str | None = None) -> None:
        """`overlap_host`: the engine runs with async scheduling (the host's overheads overlap the device).
        `tensor_parallel_size`: GPUs per replica (the step's collectives are priced with the profile's
        `allreduce_latency_s` and `allreduce_bandwidth`).

        Raises:
            ValueError: tensor_parallel_size > 1 on a profile without all-reduce figures.
        """
        self.shape = StepShape.from_arch(arch, dtype, tensor_parallel_size, kv_cache_dtype)
        self.comm = None
        if tensor_parallel_size > 1:
            if hardware.allreduce_latency_s is None or hardware.allreduce_bandwidth is None:
                raise ValueError(f"tensor_parallel_size {tensor_parallel_size}: the {hardware.name} profile has no "
                                 "allreduce_latency_s / allreduce_bandwidth")
            self.comm = TPCommModel.for_model(arch, dtype, tensor_parallel_size, hardware.allreduce_latency_s,
                                              hardware.allreduce_bandwidth)
        self.overlap_host = overlap_host
        self.hardware = hardware
        self._inv_bw = 1.0 / hardware.achieved_bandwidth
        self._inv_flops = 1.0 / hardware.achieved_matmul_flops
        self._inv_attn = 1.0 / hardware.achieved_attention_flops
        self._combine = hardware.combine
        self._weight_seconds = self.shape.weight_bytes * self._inv_bw

    def seconds_from_totals(self, num_seqs, num_tokens, num_sampled, ctx_tokens, attn_pairs) -> float:
        moved, matmul, attn = self.shape.bytes_and_flops(num_tokens, num_sampled, ctx_tokens, attn_pairs)
        if self._combine == "phases":
            kv = (moved - self.shape.weight_bytes) * self._inv_bw
            body = max(self._weight_seconds, matmul * self._inv_flops) + max(kv, attn * self._inv_attn)
        else:
            mem, compute = moved * self._inv_bw, matmul * self._inv_flops + attn * self._inv_attn
            body = max(mem, compute) if self._combine == "max" else mem + compute
        hw = self.hardware
        host = hw.step_overhead_s + hw.per_seq_overhead_s * num_seqs
        device = hw.device_step_overhead_s + hw.device_per_seq_overhead_s * num_seqs + body
        if self.comm is not None:
            device += self.comm.seconds(num_tokens, num_sampled)
        return max(host, device) if self.overlap_host else host + device

    def seconds(self, scheduled) -> float:
        """Seconds for a step given `SchedulerOutput.scheduled` (a list of `ScheduledRequest`)."""
        num_tokens = num_sampled = ctx = pairs = 0
        for item in scheduled:
            n = len(item.token_ids)
            start = item.start_position
            num_tokens += n
            ctx += start + n
            pairs += n * start + (n * (n + 1) >> 1)
            if item.needs_sample:
                num_sampled += 1
        return self.seconds_from_totals(len(scheduled), num_tokens, num_sampled, ctx, pairs)

    def decode_floor_seconds(self, batch: int = 1, context: int = 0) -> float:
        """A pure decode step of `batch` requests at `context` tokens (for reports and sanity checks)."""
        return self.seconds_from_totals(batch, batch, batch, batch * (context + 1), batch * (context + 1))

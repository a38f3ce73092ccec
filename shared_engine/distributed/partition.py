"""How a layer divides among tensor-parallel ranks. Plain integers (no torch): the capacity model and
the KV sizing use it as well as the layers.

Heads. Attention is head-parallel: a rank computes its query heads against the KV heads they read and
keeps only those KV heads in its cache. The query heads of one KV head (a GQA group) never straddle two
KV heads on a rank, so every rank runs plain GQA with one group size:
- `num_kv_heads >= tp_size`: the KV heads are split into contiguous, near-equal runs (3 KV heads over 2
  ranks: 2 and 1) and each rank takes all the query heads of its KV heads (SmolLM2-135M, 9 query / 3 KV
  heads at TP=2: 6 and 3 query heads). Uneven when tp_size does not divide num_kv_heads: the rank with
  more heads sets the step time.
- `num_kv_heads < tp_size`: each rank holds one KV head, replicated on the ranks that share it (rank r
  reads KV head r * num_kv_heads // tp_size), and those ranks split its query heads near-equally (vLLM
  replicates the same way but needs tp_size % num_kv_heads == 0; here any tp_size <= num_heads works).

Columns (MLP, vocabulary): contiguous near-equal runs; the vocabulary is padded to a multiple of
tp_size so that every rank's LM-head shard has the same size (the all-gather needs it).
"""

from __future__ import annotations

from dataclasses import dataclass


def split_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """[start, end) of part `index` when `size` items are cut into `parts` contiguous runs whose lengths
    differ by at most one (the first `size % parts` runs are one longer)."""
    base, extra = divmod(size, parts)
    start = index * base + min(index, extra)
    return start, start + base + (index < extra)


@dataclass(frozen=True)
class HeadPartition:
    """One rank's share of an attention layer: query heads [q_start, q_end), KV heads [kv_start, kv_end)."""

    q_start: int
    q_end: int
    kv_start: int
    kv_end: int

    @property
    def num_heads(self) -> int:
        return self.q_end - self.q_start

    @property
    def num_kv_heads(self) -> int:
        return self.kv_end - self.kv_start


def head_partition(num_heads: int, num_kv_heads: int, tp_size: int, rank: int) -> HeadPartition:
    """Rank `rank`'s heads (see the module docstring).

    Raises:
        ValueError: num_heads is not a multiple of num_kv_heads, or tp_size > num_heads (a rank would
            have no query head).
    """
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if tp_size > num_heads:
        raise ValueError(f"tensor_parallel_size {tp_size} exceeds the model's {num_heads} attention heads")
    group = num_heads // num_kv_heads
    if num_kv_heads >= tp_size:
        kv_start, kv_end = split_range(num_kv_heads, tp_size, rank)
        return HeadPartition(kv_start * group, kv_end * group, kv_start, kv_end)
    kv = rank * num_kv_heads // tp_size
    sharers = [r for r in range(tp_size) if r * num_kv_heads // tp_size == kv]
    q_start, q_end = split_range(group, len(sharers), sharers.index(rank))
    return HeadPartition(kv * group + q_start, kv * group + q_end, kv, kv + 1)


def max_local_kv_heads(num_heads: int, num_kv_heads: int, tp_size: int) -> int:
    """KV heads on the rank that holds the most: it sizes the KV blocks every rank allocates (one block
    table serves all ranks, so all ranks have the same number of blocks)."""
    return max(head_partition(num_heads, num_kv_heads, tp_size, r).num_kv_heads for r in range(tp_size))


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    """The vocabulary rounded up to a multiple of tp_size (padding rows are zero and never sampled)."""
    return -(-vocab_size // tp_size) * tp_size

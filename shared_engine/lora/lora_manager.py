"""`LoRAManager`: the model runner's adapters, on disk → in the CPU cache → in a GPU slot.

- CPU cache: adapters read and validated from disk (`peft_adapter.load_adapter`), held as a slot holds
  them (`slot_image.SlotImage`: model dtype, one pinned buffer on CUDA, so a slot load is asynchronous
  copies), least recently used first out beyond `max_cpu_loras`, except that an adapter a queued or running
  request uses (`acquire`d, not yet `release`d) is never evicted.
- GPU slots: `max_loras` slots in the model's LoRA layers (layers/lora.py). Before each step `prepare`
  puts every adapter the step uses into a slot, evicting the least recently used slot whose adapter no
  running request uses (`SchedulerOutput.running_loras`; the scheduler keeps those at most `max_loras`,
  so a running request never loses its slot), and returns the step's token → slot map, which the model
  runner lays out in the rows the step runs in (a CUDA graph's padded layout) with `ctx.set_token_slots`.

Adapters are keyed by `LoRARequest.cache_key` (registration id and content version): a reload under the
same name is another adapter, so requests still running on the old weights keep them until they finish.
With async scheduling a slot may be rewritten while the previous step runs: the copy is queued on the same
stream, after that step's kernels, so it never changes a step in flight.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict

import numpy as np
import torch

from shared_engine.config.lora_config import LoRAConfig
from shared_engine.core.scheduler_output import SchedulerOutput
from shared_engine.lora.errors import LoRAValidationError
from shared_engine.lora.lora_request import LoRARequest
from shared_engine.lora.peft_adapter import LoRAAdapter, content_digest, load_adapter, resolve_adapter_path
from shared_engine.lora.slot_image import SlotImage, make_slot_image
from shared_engine.lora.slot_streams import CudaStreamOps, SlotStreams, StreamOps
from shared_engine.model_arch import ModelArch
from shared_engine.model_executor.layers.lora import LoRAContext


def load_checked(lora_request: LoRARequest, arch: ModelArch, config: LoRAConfig) -> LoRAAdapter:
    """Read and validate the adapter a request names; its files must still match `lora_request.version`.

    Raises:
        LoRAValidationError: see `peft_adapter`; or the files changed since the adapter was registered.
    """
    path = resolve_adapter_path(lora_request.lora_path, config.allowed_local_lora_path)
    adapter = load_adapter(lora_request.lora_name, path, arch, config.max_lora_rank)
    if lora_request.version and content_digest(path) != lora_request.version:
        raise LoRAValidationError(f"adapter {lora_request.lora_name!r}: its files changed since it was loaded; "
                                  "load it again")
    return adapter


class LoRAManager:
    def __init__(self, model: torch.nn.Module, config: LoRAConfig, arch: ModelArch, max_num_tokens: int,
                 stream_ops: StreamOps | None = None) -> None:
        """`stream_ops`: slot loads through `SlotStreams` with these operations (tests); otherwise with
        `config.lora_slot_stream` on CUDA, a copy stream of their own; else on the current stream."""
        ref = model.lm_head.weight
        self.ctx = LoRAContext(max_num_tokens, config.max_loras, ref.dtype, ref.device, config.lora_kernel)
        model.enable_lora(self.ctx, config.max_lora_rank)
        self.model, self.config, self.arch = model, config, arch
        self.dtype, self.device = ref.dtype, ref.device
        # cache_key → the adapter as a slot holds it (model dtype, pinned on CUDA: slot_image.py), LRU first
        self._cpu: OrderedDict[str, SlotImage] = OrderedDict()
        self._pin = self.device.type == "cuda"
        self._users: dict[str, str] = {}  # request id → cache_key
        self._refs: Counter[str] = Counter()
        self._slots: list[str | None] = [None] * config.max_loras  # slot → cache_key
        self._slot_names: list[str | None] = [None] * config.max_loras  # slot → adapter name
        self._slot_lru: OrderedDict[str, int] = OrderedDict()  # cache_key → slot, LRU first
        # PEFT module → its projection's group (layers/lora.py), and each slot's groups (what its adapter targets)
        self._module_group = {m: proj.group for m, (proj, _) in model.lora_targets(0).items()}
        self._slot_groups: list[frozenset[str]] = [frozenset()] * config.max_loras
        self.num_slot_loads = 0
        self.num_disk_loads = 0  # adapters read from disk into the CPU cache
        if stream_ops is None and config.lora_slot_stream and self.device.type == "cuda":
            stream_ops = CudaStreamOps(self.device)
        self.streams = None if stream_ops is None else SlotStreams(config.max_loras, stream_ops)
        self._step_slots: set[int] = set()  # the slots the step being launched reads
        self.slot_load_seconds = 0.0  # host time spent writing slots (includes the copies on the CPU)
        # slot loads as one host-to-device copy and two foreach copies (CUDA; the CPU path writes per slice)
        self.batched = self.device.type == "cuda"

    # ---- CPU cache -----------------------------------------------------------------------------------
    def acquire(self, request_id: str, lora_request: LoRARequest) -> None:
        """Make the adapter resident in the CPU cache for a new request (reads it from disk if needed).

        Raises:
            LoRAValidationError: the adapter cannot be loaded (nothing is recorded then).
        """
        key = self._cache(lora_request)
        self._users[request_id] = key
        self._refs[key] += 1
        self._trim()

    def preload(self, lora_request: LoRARequest) -> None:
        """Validate an adapter and keep it in the CPU cache, reading its files only if it is not cached
        (the offline API's check before it queues a batch: a batch's adapters are then read from disk at
        most once, and not at all when cached). No reference is taken: an adapter no request acquires
        leaves the cache least recently used first. A cached adapter is not read again, as `acquire`
        does not: it was validated when it was read.

        Raises:
            LoRAValidationError: the adapter cannot be loaded (nothing is cached then).
        """
        self._cache(lora_request)
        self._trim()

    def _cache(self, lora_request: LoRARequest) -> str:
        key = lora_request.cache_key
        if key not in self._cpu:
            adapter = load_checked(lora_request, self.arch, self.config)
            self._cpu[key] = make_slot_image(adapter, self.dtype, self._pin)
            self.num_disk_loads += 1
        self._cpu.move_to_end(key)
        return key

    def release(self, request_id: str) -> None:
        """The request finished or was aborted: its adapter may leave the CPU cache (ids not acquired are
        ignored)."""
        key = self._users.pop(request_id, None)
        if key is None:
            return
        self._refs[key] -= 1
        if self._refs[key] <= 0:
            del self._refs[key]
        self._trim()

    def _trim(self) -> None:
        excess = len(self._cpu) - self.config.cpu_cache_size
        for key in [k for k in self._cpu if k not in self._refs][: max(0, excess)]:
            del self._cpu[key]

    @property
    def cpu_keys(self) -> list[str]:
        return list(self._cpu)

    @property
    def slot_keys(self) -> list[str | None]:
        """Each GPU slot's adapter (cache_key), None for an empty slot."""
        return list(self._slots)

    @property
    def slot_names(self) -> tuple[str, ...]:
        """Names of the adapters in GPU slots (a name twice: two versions resident), sorted."""
        return tuple(sorted(n for n in self._slot_names if n is not None))

    # ---- GPU slots -----------------------------------------------------------------------------------
    def prepare(self, out: SchedulerOutput) -> np.ndarray:
        """Load the step's adapters into slots, set `ctx.active` (the step has adapter tokens) and
        `ctx.groups` (the projection groups its adapters target: the others run no LoRA), and return
        the token → slot map, [num_tokens] int32 on the host (-1: base model), in the order of
        `out.scheduled` (decodes first), as the input builder lays tokens out.

        Raises:
            RuntimeError: more distinct adapters than slots among running requests (a scheduler bug).
        """
        row_keys = [s.request.lora_request.cache_key if s.request.lora_request is not None else None
                    for s in out.scheduled]
        step_keys = {k for k in row_keys if k is not None}
        self.ctx.active = bool(step_keys)
        pinned = step_keys | {key[1] for key in out.running_loras}
        slot_of = {key: self._slot_for(key, pinned) for key in step_keys}
        self._step_slots = set(slot_of.values())
        self.ctx.groups = frozenset().union(*(self._slot_groups[slot] for slot in self._step_slots))
        if self.streams is not None:
            self.streams.before_step(self._step_slots)
        row_slots = np.array([-1 if k is None else slot_of[k] for k in row_keys], dtype=np.int32)
        return np.repeat(row_slots, [s.num_new_tokens for s in out.scheduled])

    def step_enqueued(self) -> None:
        """The model runner enqueued the forward of the step `prepare` set up: later loads into its slots wait
        for it (with `streams`; nothing otherwise)."""
        if self.streams is not None:
            self.streams.after_step(self._step_slots)

    def _slot_for(self, key: str, pinned: set[str]) -> int:
        if key in self._slot_lru:
            self._slot_lru.move_to_end(key)
            return self._slot_lru[key]
        if None in self._slots:
            slot = self._slots.index(None)
        else:
            victim = next((k for k in self._slot_lru if k not in pinned), None)
            if victim is None:
                raise RuntimeError(f"all {len(self._slots)} LoRA slots are held by running requests")
            slot = self._slot_lru.pop(victim)
        image = self._cpu[key]
        if self.streams is None:
            self._write_slot(slot, image)
        else:
            self.streams.write(slot, lambda: self._write_slot(slot, image))
        self._slots[slot], self._slot_names[slot] = key, image.name
        self._slot_groups[slot] = frozenset(self._module_group[module] for _, module in image.parts)
        self._slot_lru[key] = slot
        return slot

    @torch.no_grad()
    def _write_slot(self, slot: int, image: SlotImage) -> None:
        """Copy `image` into `slot` on the current stream (asynchronous from pinned memory on CUDA: queued
        after the step in flight, so it never changes a step that already runs). On CUDA (`batched`) the
        whole image crosses in one host-to-device copy and lands in the slot's rows through two
        `torch._foreach_copy_` calls (A rows, contiguous; B column blocks): a rank-16 q/k/v/o adapter of
        llama-3.1-8b was 256 Python-issued copies, 10.6 ms of host time per load on the H200 at c518670."""
        started = time.perf_counter()
        if self.batched:
            self._write_slot_batched(slot, image)
        else:
            for layer in range(self.arch.num_layers):
                for module, (projection, index) in self.model.lora_targets(layer).items():
                    pair = image.parts.get((layer, module))
                    if pair is None:
                        projection.write_slot(slot, index, None, None)
                    else:
                        a, bt = pair
                        projection.write_slot(slot, index, a, bt.t())
        self.num_slot_loads += 1
        self.slot_load_seconds += time.perf_counter() - started

    def _write_slot_batched(self, slot: int, image: SlotImage) -> None:
        staged = image.buffer.to(self.device, non_blocking=True)  # pinned: PyTorch keeps it until copied
        sizes = [t.numel() for pair in image.parts.values() for t in pair]  # the buffer's layout, in order
        chunks = torch.split(staged, sizes)
        on_device = {key: (chunks[2 * i].view(a.shape), chunks[2 * i + 1].view(bt.shape))
                     for i, (key, (a, bt)) in enumerate(image.parts.items())}
        dst_a, src_a, dst_b, src_b = [], [], [], []
        for layer in range(self.arch.num_layers):
            for module, (projection, index) in self.model.lora_targets(layer).items():
                pair = image.parts.get((layer, module))
                r = 0 if pair is None else pair[0].shape[0]
                projection.prepare_rows(slot, index, r)
                if pair is None:
                    continue
                rows_a, rows_b = projection.slot_rows(slot, index, r)
                a, bt = on_device[(layer, module)]
                dst_a.append(rows_a)
                src_a.append(a)
                dst_b.append(rows_b)
                src_b.append(bt)
        if dst_a:
            torch._foreach_copy_(dst_a, src_a, non_blocking=True)
            torch._foreach_copy_(dst_b, src_b, non_blocking=True)

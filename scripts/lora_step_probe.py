"""The per-step probe of scripts/profile_lora_step.py: host timers wrapped around the engine's step pieces,
one record per `LLMEngine.step()` and one entry per launched step, with why a step ran eagerly; the profiler
windows are opened and closed around the steps the caller asks for."""

from __future__ import annotations

import time

# host pieces timed inside one step() call (seconds each)
PIECES = ("schedule", "build_inputs", "lora_prepare", "lora_set_token_slots", "graph_replay", "eager_forward",
          "logits", "sample", "launch", "launch_rest", "collect", "resolve", "process_outputs", "apply_launched")
# the pieces inside the model runner's launch (launch_rest: launch's host time outside them)
LAUNCH_PARTS = ("build_inputs", "lora_prepare", "lora_set_token_slots", "graph_replay", "eager_forward", "logits",
                "sample")



def graph_miss_reason(graph_runner, meta, num_tokens: int) -> str:
    """Why a step fits no CUDA graph (the checks of `CudaGraphRunner._bucket`, in its order)."""
    if graph_runner is None:
        return "eager mode (no graph runner)"
    nd, seqs = meta.num_decodes, meta.num_seqs
    if meta.block_tables.shape[1] > graph_runner.block_tables.shape[1]:
        return "block table wider than the graphs'"
    if nd == seqs and nd == num_tokens:
        return f"{nd} decodes > the largest decode graph {max(graph_runner.decode_sizes or [0])}"
    prefill_seqs, prefill_tokens = seqs - nd, num_tokens - nd
    if not graph_runner.mixed_prefill_sizes:
        return "prefill tokens and no mixed graphs (cuda_graph_max_prefill_tokens 0)"
    if prefill_seqs > graph_runner.max_prefill_seqs:
        return f"prefill sequences > {graph_runner.max_prefill_seqs} (MAX_PREFILL_SEQS)"
    largest = max([graph_runner.mixed_prefill_sizes[-1], *(t for _, t in graph_runner.extra_mixed_sizes)])
    if prefill_tokens > largest:
        return f"prefill tokens > {largest} (cuda_graph_max_prefill_tokens)"
    return "no bucket fits (decodes + prefill tokens)"




class StepProbe:
    """Wraps the engine's step pieces with host timers and manages the profiler windows; `close()` undoes
    every wrap. One record per `LLMEngine.step()` call, one entry per launched step."""

    def __init__(self, engine, sync, activity, decode_skip: int, decode_window: int) -> None:
        import shared_engine.model_executor.model_runner as model_runner_module

        self.engine, self.sync, self.activity = engine, sync, activity
        self.decode_skip, self.decode_window = decode_skip, decode_window
        self.records: list[dict] = []
        self.launched: list[dict] = []
        self._launch_ids: dict[int, int] = {}
        self._cur: dict | None = None
        self._undo: list = []
        self._pending_key = None
        self.windows: dict[str, dict] = {}
        self._open: tuple[str, object] | None = None
        self._decode_only_seen = 0
        self.first_call_at: float | None = None  # perf_counter at the first step() call
        runner = engine.runner
        self.lora = getattr(runner, "lora", None)
        self._wrap(engine.scheduler, "schedule", "schedule")
        self._wrap(engine.scheduler, "resolve", "resolve")
        self._wrap(engine.scheduler, "apply_launched", "apply_launched")
        self._wrap(engine, "process_outputs", "process_outputs")
        self._wrap(model_runner_module, "build_inputs", "build_inputs")
        self._wrap(runner.model, "compute_logits", "logits")
        self._wrap(runner, "_sample", "sample")
        self._wrap(runner.model, "forward", "eager_forward")
        if self.lora is not None:
            self._wrap(self.lora, "prepare", "lora_prepare")
            self._wrap(self.lora.ctx, "set_token_slots", "lora_set_token_slots")
        self.graph_runner = runner.graph_runner
        if self.graph_runner is not None:
            self._wrap(self.graph_runner, "run", "graph_replay")
            self._wrap(self.graph_runner, "select", None, after=self._on_select)
        self._wrap(runner, "launch", "launch", before=self._before_launch, after=self._after_launch)
        self._wrap(runner, "collect", "collect", after=self._after_collect)
        self._wrap(engine, "step", None, around=True)

    # ---- wrapping ------------------------------------------------------------------------------------
    def _wrap(self, obj, attr: str, piece: str | None, before=None, after=None, around: bool = False) -> None:
        had_own = attr in getattr(obj, "__dict__", {})
        original = getattr(obj, attr)
        probe = self

        def wrapper(*args, **kwargs):
            if around:
                return probe._step(original, *args, **kwargs)
            if before is not None:
                before(*args, **kwargs)
            started = time.perf_counter()
            result = original(*args, **kwargs)
            if piece is not None and probe._cur is not None:
                probe._cur["host"][piece] = probe._cur["host"].get(piece, 0.0) + time.perf_counter() - started
            if after is not None:
                after(result, *args, **kwargs)
            return result

        setattr(obj, attr, wrapper)
        self._undo.append((obj, attr, original if had_own else None))

    def close(self) -> None:
        for obj, attr, original in reversed(self._undo):
            if original is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, original)
        self._undo = []
        self._close_window()

    # ---- per call ------------------------------------------------------------------------------------
    def _step(self, original, *args, **kwargs):
        loads = (self.lora.num_slot_loads, self.lora.slot_load_seconds) if self.lora is not None else (0, 0.0)
        self._cur = {"call": len(self.records), "host": {}, "profiler_edge": False}
        started = time.perf_counter()
        if self.first_call_at is None:
            self.first_call_at = started
        result = original(*args, **kwargs)
        cur = self._cur
        cur["wall_s"] = time.perf_counter() - started
        if "launch" in cur["host"]:
            cur["host"]["launch_rest"] = cur["host"]["launch"] - sum(cur["host"].get(k, 0.0) for k in LAUNCH_PARTS)
        if self.lora is not None:
            cur["slot_loads"] = self.lora.num_slot_loads - loads[0]
            cur["slot_load_s"] = self.lora.slot_load_seconds - loads[1]
        self.records.append(cur)
        self._cur = None
        return result

    def _on_select(self, key, meta, num_tokens, *rest, **kwargs) -> None:
        self._pending_key = (key, meta, num_tokens)

    def _before_launch(self, out, *args, **kwargs) -> None:
        decode_only = bool(out.scheduled) and all(s.is_decode for s in out.scheduled)
        if decode_only:
            self._decode_only_seen += 1
        name = self._open[0] if self._open else None
        window_done = self._decode_only_seen > self.decode_skip + self.decode_window
        if (name == "prefill" and decode_only) or (name == "decode" and window_done):
            self._close_window()
        if (self._open is None and decode_only and "decode" not in self.windows
                and self._decode_only_seen == self.decode_skip + 1):
            self.open_window("decode")
        self._pending_key = None

    def _after_launch(self, launched, out, *args, **kwargs) -> None:
        scheduled = out.scheduled
        decodes = sum(1 for s in scheduled if s.is_decode)
        prefill = [s for s in scheduled if not s.is_decode]
        adapters = {s.request.lora_request.cache_key for s in scheduled if s.request.lora_request is not None}
        entry = {"index": len(self.launched), "call": self._cur["call"] if self._cur else None,
                 "decodes": decodes, "prefill_seqs": len(prefill),
                 "prefill_tokens": sum(s.num_new_tokens for s in prefill), "adapters": len(adapters),
                 "window": self._open[0] if self._open else None}
        if self._pending_key is None:
            entry["graph"] = None
            entry["eager_reason"] = "eager mode (no graph runner)"
        else:
            key, meta, num_tokens = self._pending_key
            entry["graph"] = None if key is None else list(key)
            if key is None:
                entry["eager_reason"] = graph_miss_reason(self.graph_runner, meta, num_tokens)
            else:
                entry["graph_variant"] = {0: "base_only" if self.lora is not None else "base", 1: "lora_all",
                                          2: "lora_attention"}.get(int(key[3]), str(key[3]))
        self._launch_ids[id(launched)] = entry["index"]
        self.launched.append(entry)
        if self._open is not None:
            self._open[2].append(entry["index"])

    def _after_collect(self, result, step, *args, **kwargs) -> None:
        index = self._launch_ids.pop(id(step), None)
        if index is not None and step.span is not None:
            start, end = step.span
            self.launched[index]["gpu_span_s"] = start.elapsed_time(end) / 1e3
        if index is not None and self._cur is not None:
            self.launched[index]["collected_in_call"] = self._cur["call"]

    # ---- profiler windows ----------------------------------------------------------------------------
    def open_window(self, name: str) -> None:
        from torch.profiler import profile

        self.sync()
        if self._cur is not None:
            self._cur["profiler_edge"] = True
        prof = profile(activities=[self.activity])
        prof.start()
        self._open = (name, prof, [])

    def _close_window(self) -> None:
        if self._open is None:
            return
        name, prof, steps = self._open
        self.sync()
        prof.stop()
        if self._cur is not None:
            self._cur["profiler_edge"] = True
        self.windows[name] = {"profiler": prof, "steps": steps}
        self._open = None

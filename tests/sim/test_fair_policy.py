"""The capacity model under `scheduling_policy="fair"`: a light tenant queued behind a heavy tenant's flood
is served first under VTC and last under FCFS; workloads can make each adapter a tenant."""

from __future__ import annotations

from shared_engine.config import EngineConfig
from shared_engine.sim import Simulator, WorkloadSpec, load_hardware
from shared_engine.sim.model_shape import resolve_arch
from shared_engine.sim.workload import RequestSpec, TraceWorkload, WorkloadGenerator


def _trace() -> list[RequestSpec]:
    heavy = [RequestSpec(f"h{i}", 0.0, [11 + i % 50] * 900, 200, tenant="heavy") for i in range(60)]
    light = [RequestSpec(f"l{i}", 0.01, [7] * 50, 10, tenant="light") for i in range(5)]
    return heavy + light


def _finish_times(policy: str) -> dict[str, list[float]]:
    _, arch = resolve_arch("qwen3-0.6b")
    config = EngineConfig.from_flat(max_model_len=4096, max_num_seqs=16, max_num_batched_tokens=2048,
                                    scheduling_policy=policy)
    sim = Simulator(config, arch, load_hardware("L4"))
    workload = TraceWorkload(_trace())
    done: dict[str, list[float]] = {"heavy": [], "light": []}
    finish = workload.on_finish

    def on_finish(spec, output_ids, now):
        done[spec.tenant].append(now)
        return finish(spec, output_ids, now)

    workload.on_finish = on_finish
    metrics = sim.run(workload)
    assert metrics.summary()["completed"] == 65
    return done


def test_fair_policy_serves_the_light_tenant_first():
    fair, fcfs = _finish_times("fair"), _finish_times("fcfs")
    # FCFS: the light requests wait for most of the 60 heavy ones; VTC: they finish before most of them
    assert max(fcfs["light"]) > sorted(fcfs["heavy"])[40]
    assert max(fair["light"]) < sorted(fair["heavy"])[10]
    assert max(fair["light"]) < max(fcfs["light"]) / 5


def test_tenant_per_adapter():
    spec = WorkloadSpec.from_dict({"num_requests": 40, "arrival": {"process": "poisson", "rate": 100},
                                   "adapters": {"num_adapters": 3, "tenant_per_adapter": True,
                                                "base_fraction": 0.2}})
    gen = WorkloadGenerator(spec, vocab_size=1000, max_model_len=2048)
    requests = gen.pop_due(1e9)
    assert len(requests) == 40
    assert all(r.tenant == r.lora_name for r in requests)
    assert {r.tenant for r in requests} > {None, "adapter-0"}

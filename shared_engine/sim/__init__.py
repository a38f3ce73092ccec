"""Capacity and cost model: the engine's real `Scheduler` and `BlockManager` in simulated time, no model.

    python -m shared_engine.sim --config examples/engine-llama-3.1-8b.yaml \
        --workload examples/chat-poisson.yaml --gpu H200 --replicas 2

Pieces, one per file: `hardware` (device profiles, data in `hardware_profiles/`), `calibration` (fit to a
recorded step profile in `step_profiles/`), `step_time` (the roofline), `model_shape`, `distributions`,
`arrivals`, `workload_spec` + `workload` (requests with real shared prefixes), `simulator`, `metrics`,
`cost`, `report`; `spec_policy_sim` (a speculation policy's fixed-batch run at calibrated step costs). Imports
no torch.
"""

from shared_engine.sim.hardware import HardwareProfile, hardware_names, load_hardware
from shared_engine.sim.simulator import Simulator
from shared_engine.sim.step_time import StepTimeModel
from shared_engine.sim.workload import RequestSpec, TraceWorkload, WorkloadGenerator
from shared_engine.sim.workload_spec import WorkloadSpec

__all__ = ["HardwareProfile", "RequestSpec", "Simulator", "StepTimeModel", "TraceWorkload", "WorkloadGenerator",
           "WorkloadSpec", "hardware_names", "load_hardware"]

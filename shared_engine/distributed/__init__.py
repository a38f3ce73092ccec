"""Tensor parallelism: process groups and collectives (`parallel_state`), how a layer's heads and
columns divide among ranks (`partition`, torch-free), the worker processes of ranks 1..N-1
(`worker_process`) and rank 0's executor that drives them (`tp_executor`)."""

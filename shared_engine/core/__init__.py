"""Scheduling core: requests, the block manager and the scheduler. Imports no torch or model code, so the
capacity model can drive it unchanged."""

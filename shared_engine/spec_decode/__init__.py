"""Speculative decoding: proposers (behind `registry.py`), the per-step policy and the `SpecDecoder` that
drives them; verification is `sampling/rejection_sampler.py`."""

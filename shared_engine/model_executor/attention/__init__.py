"""Attention backends over the paged KV cache, chosen through a small registry (`registry.py`)."""

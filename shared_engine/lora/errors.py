"""`LoRAValidationError`: an adapter refused before it is accepted (a 400 naming the problem)."""

from __future__ import annotations


class LoRAValidationError(ValueError):
    """The adapter cannot be served: missing files, rank over `max_lora_rank`, shapes that do not fit the
    base model, unknown target modules, an unsupported dtype or PEFT option, or a path outside the allowed
    adapter directory. A `ValueError`, so every entry point answers it as a bad request."""

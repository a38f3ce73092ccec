"""`LoRARegistry`: the server's named adapters (`--lora-modules`, `POST /v1/load_lora_adapter`).

The API process validates an adapter completely (`lora_manager.load_checked`) before registering it, so a
bad adapter is a 400 at load, never a failure at first use; a request's `model` names an adapter here and
carries its `LoRARequest` to the engine. Each registration gets a new `lora_int_id` and the digest of the
files as `version`: loading under a name already registered replaces it with a new version (requests
already running keep the old one until they finish; new requests get the new one, and the two never share
prefix-cache blocks). Unregistering affects only new requests (404 from then on).
"""

from __future__ import annotations

import itertools
import threading

from shared_engine.config.lora_config import LoRAConfig
from shared_engine.lora.errors import LoRAValidationError
from shared_engine.lora.lora_manager import load_checked
from shared_engine.lora.lora_request import LoRARequest
from shared_engine.lora.peft_adapter import content_digest, resolve_adapter_path
from shared_engine.model_arch import ModelArch


class LoRARegistry:
    def __init__(self, arch: ModelArch, config: LoRAConfig, base_model_name: str) -> None:
        self.arch, self.config, self.base_model_name = arch, config, base_model_name
        self._adapters: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # loads run in worker threads

    def register(self, name: str, path: str) -> LoRARequest:
        """Validate the adapter at `path` and serve it as `name` (replacing an adapter of that name).

        Raises:
            LoRAValidationError: LoRA is off, an empty or reserved name, or a bad adapter (see `peft_adapter`).
        """
        if not self.config.enable_lora:
            raise LoRAValidationError("LoRA is not enabled (start the server with --enable-lora)")
        if not isinstance(name, str) or not name.strip():
            raise LoRAValidationError("lora_name must be a non-empty string")
        if name == self.base_model_name:
            raise LoRAValidationError(f"lora_name {name!r} is the base model's name")
        resolved = resolve_adapter_path(path, self.config.allowed_local_lora_path)
        probe = LoRARequest(name, 1, str(resolved))
        load_checked(probe, self.arch, self.config)  # every check, before anything is registered
        with self._lock:
            request = LoRARequest(name, next(self._ids), str(resolved), content_digest(resolved))
            self._adapters[name] = request
        return request

    def unregister(self, name: str) -> LoRARequest:
        """Stop serving `name` to new requests. Raises `KeyError` for a name not registered."""
        with self._lock:
            return self._adapters.pop(name)

    def get(self, name: str) -> LoRARequest | None:
        return self._adapters.get(name)

    def adapters(self) -> list[LoRARequest]:
        return list(self._adapters.values())


def parse_lora_modules(specs: list[str] | None) -> list[tuple[str, str]]:
    """`--lora-modules name=path ...` → [(name, path)]. Raises `ValueError` for an entry without `=`."""
    pairs = []
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules entries are name=path, got {spec!r}")
        pairs.append((name, path))
    return pairs

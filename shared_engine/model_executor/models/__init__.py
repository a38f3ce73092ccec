"""Model architectures (a registry keyed by the Hugging Face `architectures` name)."""

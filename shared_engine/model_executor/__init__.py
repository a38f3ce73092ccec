"""Model execution: layers, the Llama-family model, attention backends and the model runner."""

"""Models: GGUF files, their facts and bounds, the VRAM plan, synthetic models."""

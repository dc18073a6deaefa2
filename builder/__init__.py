"""moe-stack: images and compose stacks for hybrid CPU+GPU MoE inference."""

__version__ = "0.1.0"

"""The floor under the engine adapters: CPU targets, toolchains and CUDA releases (with their PyPI
wheels), flag contracts, the engine pins and git clone commands. Facts about platforms and files,
no engine: the adapters build on them, and images/ builds on the adapters."""

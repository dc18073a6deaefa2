"""This host: what it has (CPU, NUMA, memory, GPUs) and where a stack's threads and memory go."""

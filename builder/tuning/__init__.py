"""Tuning a stack: the search over its engine's levers with the tools image's llama-bench, the winner
written back into the stack file, and the plot of the trials."""

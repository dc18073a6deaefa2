"""The `moe-stack` command line: thin typer layers over the packages beside it."""

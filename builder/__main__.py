"""`python -m builder` is `moe-stack`."""

from builder.cli import main

main()

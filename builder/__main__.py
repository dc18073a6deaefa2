"""`python -m builder` is `moe-stack`."""

from builder.cli.main import main

main()

"""The typed stack file: what `compose` writes and every later verb reads (services, secrets, the
x-moe-stack record), the service parts the features share, and what a stack needs of its host."""

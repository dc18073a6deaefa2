"""Stacks: from the user's options to a compose file, and running, measuring and diagnosing it."""

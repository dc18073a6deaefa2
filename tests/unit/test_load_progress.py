"""The line `up` shows while the engine loads (stacks/load_progress.py)."""

from __future__ import annotations

from builder.stacks.load_progress import WIDTH, newest_line


def test_the_newest_line_worth_showing() -> None:
    log = "llama_model_loader: loaded meta data\nload_tensors: loading model tensors\n.........\n\n"
    assert newest_line(log) == "load_tensors: loading model tensors"
    # Colours and cursor moves never reach the terminal; runs of spaces fold.
    assert newest_line("\x1b[32mmain:   server is listening\x1b[0m\r\n") == "main: server is listening"
    long = newest_line("x" * (WIDTH * 2))
    assert long is not None and len(long) == WIDTH and long.endswith("…")
    assert newest_line("") is None and newest_line("....\n. .\n") is None

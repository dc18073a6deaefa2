"""The line `up` shows while the engine loads (running/load_progress.py)."""

from __future__ import annotations

from builder.running.load_progress import WIDTH, newest_line


def test_the_newest_line_worth_showing() -> None:
    log = "llama_model_loader: loaded meta data\nload_tensors: loading model tensors\n.........\n\n"
    assert newest_line(log) == "load_tensors: loading model tensors"
    # Colours and cursor moves never reach the terminal; runs of spaces fold.
    assert newest_line("\x1b[32mmain:   server is listening\x1b[0m\r\n") == "main: server is listening"
    long = newest_line("x" * (WIDTH * 2))
    assert long is not None and len(long) == WIDTH and long.endswith("…")
    assert newest_line("") is None and newest_line("....\n. .\n") is None


def test_an_engines_log_reaches_the_terminal_without_its_controls() -> None:
    """C1 controls (U+009B starts a sequence on many terminals), OSC strings (a title, a clipboard
    write) and a lone carriage return were passed on to the terminal as the engine printed them."""
    hostile = "load\x9b2J \x1b]52;c;aGk=\x07tensors\x1b]0;title\x1b\\ \x90q\x9c done\r\x85\n"
    assert newest_line(hostile) == "load tensors done"

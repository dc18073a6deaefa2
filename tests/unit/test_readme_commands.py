"""The README's commands, as a newcomer copies them (issue 29, item 2): every `moe-stack` command in its
shell blocks names a verb and options the command line has (with a value of their fixed choices, where
they have them), and the ones that need nothing but this machine (no Docker, GPU, network, root or a model
of the user's) run as written and exit 0, in a scratch directory. A renamed option or a removed choice
fails here, not in a reader's terminal. Values checked only in a verb's body (`--cpu zen5x`) are not.

Placeholders stay placeholders: `...` stands for options given elsewhere (a missing required option is then
accepted), and a path the reader supplies (`/models/...`, `~/src/...`) need not exist."""

from __future__ import annotations

import re
import shlex
import tempfile
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
import typer
from typer._click import Context
from typer._click import exceptions as cli_errors  # the click typer 0.29 vendors and builds the CLI on

from builder.cli.main import app
from tests.cli import run_cli

ROOT = Path(__file__).resolve().parents[2]
# The front page and the manual: every shell block of each is held to the command line.
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
GROUP = typer.main.get_command(app)
# Verbs that need something beyond this machine's Python: Docker, a GPU, the network, root, a model.
NEEDS_MORE = {
    "build", "up", "down", "smoke", "publish", "pull", "bundle", "load", "base", "demo", "tune", "bench",
    "kt-convert", "fetch-model", "doctor", "compose", "plan",
}  # fmt: skip
NETWORK_OPTIONS = ("--edge",)  # matrix --edge asks the upstream repositories for their heads
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|\b[A-Z][A-Z_]{2,}\b|\$|~")


def readme_commands() -> Iterator[str]:
    """Each `moe-stack ...` command of the README's and docs/' ```sh blocks, continuation lines joined,
    comments and optional-argument brackets dropped."""
    blocks = [re.findall(r"^```sh\n(.*?)^```", page.read_text(), re.MULTILINE | re.DOTALL) for page in PAGES]
    for block in (block for page in blocks for block in page):
        for line in block.replace("\\\n", " ").splitlines():
            if "moe-stack" not in line.split("#", 1)[0]:
                continue  # curl's JSON spans lines; only moe-stack's commands are read
            words = shlex.split(line, comments=True)
            for start, word in enumerate(words):
                if word.endswith("moe-stack"):  # `moe-stack`, `sudo moe-stack`, `M=$(moe-stack`
                    rest = [w.strip("[]").rstrip(")") for w in words[start + 1 :] if w.strip("[]")]
                    yield shlex.join(["moe-stack", *rest])
                    break


COMMANDS = sorted(set(readme_commands()))


def test_the_readme_has_commands_to_check() -> None:
    assert len(PAGES) > 5 and len(COMMANDS) > 30 and any(c.startswith("moe-stack compose") for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_is_one_the_command_line_takes(command: str) -> None:
    args = [arg for arg in shlex.split(command)[1:] if arg != "..."]
    try:
        name, verb, rest = GROUP.resolve_command(Context(GROUP), args)
        assert name is not None and verb is not None, f"{command}: no such verb"
        verb.make_context(name, rest)
    except cli_errors.MissingParameter:
        assert "..." in command, f"{command}: a required option is missing"
    except cli_errors.BadParameter as error:
        reader_path = "does not exist" in error.format_message()
        assert reader_path, f"{command}: {error.format_message()}"
    except cli_errors.ClickException as error:
        raise AssertionError(f"{command}: {error.format_message()}") from None


RUNNABLE = [
    command
    for command in COMMANDS
    if shlex.split(command)[1] not in NEEDS_MORE
    and not PLACEHOLDER.search(command)
    and not any(option in shlex.split(command) for option in NETWORK_OPTIONS)
]


def test_some_commands_are_run_as_written() -> None:
    assert {shlex.split(command)[1] for command in RUNNABLE} >= {
        "render",
        "synth-moe",
        "matrix",
        "cmake-args",
    }


@pytest.mark.parametrize("command", RUNNABLE)
def test_a_command_that_needs_only_this_machine_runs_as_written(command: str) -> None:
    """Run in a scratch directory, the README's /tmp paths moved into it, removed at the end (an R1
    slice is most of a GB)."""
    with tempfile.TemporaryDirectory() as scratch:
        args = [arg.replace("/tmp/", f"{scratch}/") for arg in shlex.split(command)[1:]]
        result = run_cli(*args, cwd=Path(scratch), timeout=600)
    assert result.returncode == 0, f"{command}: {result.stdout[-2000:]}{result.stderr[-2000:]}"


def test_the_top_level_help_flows_each_verbs_summary_at_80_columns() -> None:
    """The command list wraps each verb's first paragraph at the terminal's width only: a line of an entry
    ends early (the next word would have fit) only where the docstring broke its own lines."""
    result = run_cli("--help", env={"COLUMNS": "80"})
    assert result.returncode == 0
    panel = result.stdout.split("Commands")[1]
    entries: list[list[str]] = []
    for row in panel.splitlines()[1:]:
        if not row.startswith("│"):
            break
        verb, text = row[1:-1][:13].strip(), row[1:-1][13:].rstrip()
        if verb:
            entries.append([])
        entries[-1].append(text.strip())
    width = max(len(line) for entry in entries for line in entry)
    early = [
        (line, following)
        for entry in entries
        for line, following in pairwise(entry)
        if len(line) + 1 + len(following.split()[0]) <= width
    ]
    assert len(entries) > 20 and not early, early[:3]

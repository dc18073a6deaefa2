"""Text moe-stack did not write (an image's or engine's output, a presets file, a bundle's compose file):
what may reach the terminal of it, and YAML read as plain data.

A terminal acts on escape sequences and on the C1 controls (U+0080-U+009F; U+009B alone starts a
sequence on many terminals): text shown to the user keeps tabs and newlines, loses the rest. YAML's
aliases let a few bytes name a structure that refers to itself (a reader recursing into it runs out of
stack) or grows exponentially: the files moe-stack reads from others have no use for them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

# Every C0 control but tab and newline, DEL and the C1 controls.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# The same with tab and newline: what a one-line value (an argument, a name) never holds.
ANY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
# An escape sequence whole: CSI (ESC [ or U+009B, parameters, a final byte), OSC and the other strings
# (ESC ] P X ^ _, up to BEL or ST), or ESC and one character.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
)


def printable(text: str) -> str:
    """`text` as it may be shown: escape sequences removed whole, every other control character but tab
    and newline dropped (a carriage return too: it would let a line overwrite what came before it)."""
    return CONTROL.sub("", _SEQUENCE.sub("", text))


class _NoAliases(yaml.SafeLoader):
    """PyYAML's safe loader, refusing any alias (`*name`)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.composer.ComposerError(
                None, None, "an alias (*name): write the value out in full", mark
            )
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    """`text` as plain data (YAML's safe types), aliases refused: yaml.YAMLError when it isn't."""
    return yaml.load(text, Loader=_NoAliases)


class UnreadableYaml(ValueError):
    """A YAML file that can't be read or parsed; its text is the problem, in one line."""


def read_yaml(path: Path) -> Any:
    """The YAML file at `path` as plain data (`load_yaml`); UnreadableYaml when it can't be."""
    try:
        return load_yaml(path.read_text())
    except OSError as err:
        raise UnreadableYaml(f"can't be read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UnreadableYaml(f"is not plain YAML: {yaml_problem(err)}") from None


def yaml_problem(err: yaml.YAMLError) -> str:
    """What is wrong with a YAML text, in one line: the parser's problem and its line."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{problem} (line {mark.line + 1})" if mark is not None else str(problem)

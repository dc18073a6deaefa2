"""The engine's flag contract: which server flags a built binary accepts, read from its `--help`.

The build captures `llama-server --help` (the raw text goes into the image, the parsed flags into
a label). ik_llama.cpp's --help leaves out accepted flags (-ot, -thp, -cmoe among them), so for it
the build adds the flag literals of the argument parser the binary was compiled from. Stack emission
checks every flag it renders against the image's contract and translates
neutral options (flash attention, fused MoE, MLA) into what that engine version understands, so a
flag an engine version removed (ik_llama.cpp dropped `-fmoe` in PR #863) fails at emit time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from builder.errors import StackError

LABEL = "io.moe-stack.server-flags"
# An option line: some indent (ik_llama.cpp indents long-only options by 9), then a flag ("-x",
# "--long-name"). Description continuation lines are indented further (col 34 or 40).
_OPTION_LINE = re.compile(r"^\s{0,12}(-{1,2}[A-Za-z][\w.-]*.*)$")
_FLAG = re.compile(r"^-{1,2}[A-Za-z][\w.-]*$")
_ALLOWED = re.compile(r"allowed values:\s*([\w.]+(?:,\s*[\w.]+)*)\s*$")
# A token that is a flag, not a value such as "-1" or "-0.5".
_LOOKS_LIKE_FLAG = re.compile(r"^-{1,2}[A-Za-z]")


def parse_help(text: str) -> dict[str, str]:
    """Every flag spelling in a `--help` text, mapped to its argument placeholder ('' if none)."""
    flags: dict[str, str] = {}
    for names, metavar in _options(text):
        for name in names:
            flags.setdefault(name, metavar)
    return flags


def option_names(text: str) -> list[tuple[str, ...]]:
    """Each option of a `--help` text as its spellings (`-ngl, --gpu-layers, --n-gpu-layers`)."""
    return [names for names, _ in _options(text)]


def _options(text: str) -> list[tuple[tuple[str, ...], str]]:
    """(spellings, argument placeholder) of each option line; a placeholder whose description lists
    its `allowed values: a, b, c` (mainline's -ctk/-ctv) becomes argparse's `{a,b,c}` (check_choice)."""
    options = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        match = _OPTION_LINE.match(line)
        if not match:
            continue
        # "-t,    --threads N    description": commas may be padded for alignment; the
        # description starts after the first run of two or more spaces past the names.
        option = re.sub(r",\s+", ", ", match.group(1).rstrip())
        head = re.split(r"\s{2,}", option, maxsplit=1)[0]
        pieces = [piece.strip() for piece in head.split(", ")]
        metavar = ""
        names = []
        for piece in pieces:
            name, _, rest = piece.partition(" ")
            if not _FLAG.match(name):
                break
            names.append(name)
            metavar = rest.strip() or metavar
        if names:
            options.append((tuple(names), metavar and (_choices(lines[index + 1 :]) or metavar)))
    return options


def _choices(description: list[str]) -> str:
    """`{a,b,c}` from the `allowed values:` line of an option's description (the lines up to the next
    option); '' where it lists none."""
    for line in description:
        if _OPTION_LINE.match(line):
            break
        listed = _ALLOWED.search(line)
        if listed:
            return "{" + ",".join(value.strip() for value in listed.group(1).split(",")) + "}"
    return ""


def parse_parser_literals(text: str) -> dict[str, str]:
    """Flag-like string literals of an argument parser's source, one per line (no placeholders)."""
    return {line.strip(): "" for line in text.splitlines() if _FLAG.match(line.strip())}


def parse_contract(help_text: str, parser_literals: str | None) -> dict[str, str]:
    """The flags a server accepts: its --help, plus its parser's literals where --help is incomplete."""
    flags = parse_help(help_text)
    if parser_literals is not None:
        flags = {**parse_parser_literals(parser_literals), **flags}
    return flags


def to_label(flags: dict[str, str]) -> str:
    return json.dumps(flags, sort_keys=True, separators=(",", ":"))


def from_label(value: str) -> dict[str, str]:
    return json.loads(value)


def check_args(args: list[str], flags: dict[str, str], who: str) -> None:
    """Fail naming the first flag in `args` that the engine (described by `who`) does not accept."""
    unknown = [arg for arg in args if looks_like_flag(arg) and arg.split("=", 1)[0] not in flags]
    if unknown:
        raise StackError(
            f"{who} does not accept {', '.join(unknown)} (its --help lists no such flag); "
            "drop it, or use an image of an engine version that has it"
        )


def looks_like_flag(arg: str) -> bool:
    """Whether a command-line word is a flag rather than a value (`-1`, a budget or seed, is a value)."""
    return bool(_LOOKS_LIKE_FLAG.match(arg))


def takes_value(flags: dict[str, str], flag: str) -> bool:
    """Whether `flag` is given a value (e.g. ik's `-fa` became `-fa on|off|auto` in PR #863)."""
    return bool(flags.get(flag))


def has_choices(flags: dict[str, str] | None, flag: str) -> bool:
    """Whether the contract lists `flag`'s choices (argparse's `{a,b,c}`)."""
    placeholder = (flags or {}).get(flag, "")
    return placeholder.startswith("{") and placeholder.endswith("}")


def check_choice(flags: dict[str, str] | None, flag: str, value: str, who: str) -> None:
    """Fail where the contract lists `flag`'s choices and `value` is not one."""
    if not has_choices(flags, flag):
        return
    choices = (flags or {})[flag][1:-1].split(",")
    if value not in choices:
        raise StackError(f"{who} takes {flag} {' | '.join(choices)}, not {value!r}: give one of them")


def takes_stages(flags: dict[str, str] | None) -> bool:
    """Whether the build's --spec-type takes a speculative stage with its settings (`draft:n_max=4`: its
    --help shows `SPEC[:k=v,...]`), as ik_llama.cpp's since its speculative rework; an unknown contract is
    taken to, as the pinned tree does."""
    return flags is None or "k=v" in flags.get("--spec-type", "")


def flag_args(settings: Mapping[str, str]) -> list[str]:
    """`settings` as a command line's words: each flag, then its value, in their order."""
    return [word for pair in settings.items() for word in pair]


def has_flag(flags: dict[str, str] | None, flag: str) -> bool:
    """Whether the image's contract lists `flag`; an unknown contract (None) is taken to have it, and
    the adapter writes its engine's current syntax."""
    return flags is None or flag in flags


def required_flag(flags: dict[str, str] | None, flag: str, engine: str, drop: str, what: str = "") -> str:
    """`flag`, where the image's contract has it (`has_flag`); else StackError: this `engine` build has no
    `what` (the flag itself unless named); drop `drop`, the option that asked for it."""
    if not has_flag(flags, flag):
        raise StackError(f"this {engine} build has no {what or flag}; drop {drop}")
    return flag

"""docker compose reads `$NAME` anywhere in a file as a variable: what moe-stack writes has every `$`
doubled (`literal`), and what it reads back is undone (`unliteral`, `meant`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

_T = TypeVar("_T")


def literal(value: _T) -> _T:
    """`value` with every `$` doubled: docker compose reads `$NAME` anywhere in the file (x-moe-stack
    too) as a variable, and would mount another directory than the one checked, or refuse the stack."""
    return cast(_T, _mapped(value, lambda text: text.replace("$", "$$")))


def _mapped(value: object, change: Callable[[str], str]) -> object:
    """`value` with `change` applied to every string in it (keys stay)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_mapped(item, change) for item in value]
    if isinstance(value, dict):
        return {key: _mapped(item, change) for key, item in value.items()}
    return value


def unliteral(text: str) -> str:
    """A string of an emitted compose file as moe-stack meant it (`literal` undone)."""
    return text.replace("$$", "$")


def meant(value: _T) -> _T:
    """`value` (a string, or lists and mappings of them) as moe-stack meant it: `literal` undone."""
    return cast(_T, _mapped(value, unliteral))

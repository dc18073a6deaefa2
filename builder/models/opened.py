"""A model as a stack holds it: its path checked once by its format, and what the stack needs of its files
(their facts, their parts, their size, their content's identity) each read at most once, on first use. One
compose opens the model once and passes this along: its header is read once, however many steps ask."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from builder.models.facts import ModelFacts
from builder.models.formats import ModelFormat
from builder.models.identity import model_identity


class OpenedModel:
    """The model at `path` (checked: its directory resolved, its own name kept) in `format`."""

    def __init__(self, path: Path, model_format: ModelFormat) -> None:
        self.path = path
        self.format = model_format

    @classmethod
    def open(cls, path: Path, model_format: ModelFormat) -> OpenedModel:
        """The model `path` names, checked by its format (ModelError, one line, when it is not one)."""
        return cls(model_format.check(path), model_format)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def stem(self) -> str:
        """Its name without the format's suffix and a split model's numbering."""
        return self.format.stem(self.path)

    @cached_property
    def facts(self) -> ModelFacts:
        return self.format.facts(self.path)

    @cached_property
    def parts(self) -> tuple[Path, ...]:
        """Every file of it (a split GGUF's parts in order; a converted directory's files)."""
        return tuple(self.format.parts(self.path))

    @cached_property
    def size(self) -> int:
        """Bytes of all its files."""
        return self.format.size(self.path)

    @cached_property
    def identity(self) -> str:
        """The hash of its files' headers and tensor indexes (models/identity.py)."""
        return model_identity(list(self.parts))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpenedModel) and self._key == other._key

    @property
    def _key(self) -> tuple[Path, str]:
        return self.path, self.format.name

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"OpenedModel({str(self.path)!r})"

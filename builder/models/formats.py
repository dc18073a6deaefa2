"""A model file format, as the stack layer needs it: checking a file, the facts a plan reads, the files
that make up a model, and its name. Each engine adapter names the format it loads (Engine.model_format);
the stack layer asks the adapter, so no module above the engines assumes GGUF."""

from __future__ import annotations

import re
from pathlib import Path

from builder.models.model_files import check_gguf
from builder.models.planner import ModelFacts, model_bytes, read_facts, split_parts

_SPLIT_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")


class ModelFormat:
    """GGUF (llama.cpp's format; KTransformers' LLAMAFILE method reads it too)."""

    name = "GGUF"
    suffix = ".gguf"

    def check(self, path: Path) -> Path:
        """`path` resolved, if it is a readable file of this format; ModelError otherwise."""
        return check_gguf(path)

    def facts(self, path: Path) -> ModelFacts:
        """What a plan needs from the model (its header; every part of a split one)."""
        return read_facts(path)

    def parts(self, path: Path) -> list[Path]:
        """Every file of the model `path` names (a split GGUF: all its parts, in order)."""
        return split_parts(path)

    def size(self, path: Path) -> int:
        """Bytes of all its files."""
        return model_bytes(path)

    def stem(self, path: Path) -> str:
        """Its name without the format's suffix and the split numbering
        (`DeepSeek-R1-IQ4_XS-00001-of-00009.gguf` → `DeepSeek-R1-IQ4_XS`)."""
        return _SPLIT_SUFFIX.sub("", path.name.removesuffix(self.suffix))


GGUF = ModelFormat()
FORMATS = (GGUF,)  # every format an engine here loads

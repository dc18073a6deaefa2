"""A model file format, as the stack layer needs it: checking a file, the facts a plan reads, the files
that make up a model, and its name. Each engine adapter names the format it loads (Engine.model_format);
the stack layer asks the adapter, so no module above the engines assumes GGUF."""

from __future__ import annotations

import re
from pathlib import Path

from builder.files import user_path
from builder.models.facts import ModelFacts
from builder.models.gguf_facts import model_bytes, read_facts, split_parts
from builder.models.kt_weights import converted_bytes, converted_facts, converted_files, read_converted
from builder.models.model_files import check_gguf

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
FORMATS = (GGUF,)  # every single-file format an engine here loads (bundles carry these)


class KtWeightsFormat(ModelFormat):
    """KTransformers' expert weights: a GGUF (its LLAMAFILE backend), or a directory of kt-kernel's
    converted AMXINT4/AMXINT8 experts (kt_weights), told apart by the path."""

    name = "GGUF or kt-kernel's converted weights"

    def check(self, path: Path) -> Path:
        path = user_path(path)
        if not path.is_dir():
            return super().check(path)
        read_converted(path)
        return path.resolve()

    def facts(self, path: Path) -> ModelFacts:
        return converted_facts(path) if path.is_dir() else super().facts(path)

    def parts(self, path: Path) -> list[Path]:
        return converted_files(path) if path.is_dir() else super().parts(path)

    def size(self, path: Path) -> int:
        return converted_bytes(path) if path.is_dir() else super().size(path)

    def stem(self, path: Path) -> str:
        return path.name if path.is_dir() else super().stem(path)


KT_WEIGHTS = KtWeightsFormat()

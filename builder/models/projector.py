"""A multimodal projector (`mmproj`): the vision tower and projection a llama.cpp engine loads beside the
model (`--mmproj`) to read images. It is a GGUF of its own, of architecture `clip` (both engines' mtmd
library: llama.cpp 0c1e57098's tools/mtmd/clip.cpp, ik_llama.cpp 55d3c05's examples/mtmd/clip.cpp).

What a stack needs from it: that it is one (a vision encoder), the width its projection writes (the
engines refuse a projector whose width is not the model's embedding length), and its weights' bytes,
which go to the GPU with the model's attention unless the projector is kept on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder.errors import ModelError
from builder.models.gguf_facts import header_number, header_text, open_gguf

CLIP_ARCH = "clip"


@dataclass(frozen=True)
class ProjectorFacts:
    kind: str  # clip.projector_type: gemma3, qwen3vl_merger, llama4, kimivl...
    projection_dim: int  # the embedding width it writes: the model's must match
    weight_bytes: int  # every tensor's data
    image_size: int  # the side, in pixels, an image is resized to (the largest, where it varies)
    patch_size: int
    width: int  # the vision tower's embedding length
    heads: int
    ffn: int  # its feed-forward width

    @property
    def encoder_buffer_bytes(self) -> int:
        """The vision tower's compute buffer for one image, estimated from its widths (not measured): its
        largest stage, the attention scores of every patch pair in every head (f32, without flash
        attention), or four f32 activations of the wider of its embedding and feed-forward widths."""
        patches = (self.image_size // max(1, self.patch_size)) ** 2
        return max(patches * patches * self.heads * 4, 4 * patches * max(self.width, self.ffn) * 4)


def read_projector(path: Path) -> ProjectorFacts:
    """ProjectorFacts from an mmproj GGUF's header; ModelError naming what makes it not a vision one."""
    reader = open_gguf(path)
    arch = header_text(reader, "general.architecture")
    if arch != CLIP_ARCH:
        raise ModelError(
            f"{path.name} is a {arch} model, not a multimodal projector (a `clip` GGUF, usually "
            "mmproj-*.gguf beside the model's files): give the projector to --mmproj"
        )
    if not header_number(reader, "clip.has_vision_encoder", default=0):
        raise ModelError(
            f"{path.name} has no vision encoder (clip.has_vision_encoder): an audio projector reads no "
            "images; give the model's vision mmproj"
        )
    # A projector of one modality says its kind in clip.projector_type, one of several per modality.
    kind_key = next(
        (key for key in ("clip.projector_type", "clip.vision.projector_type") if key in reader.fields),
        "clip.projector_type",
    )
    return ProjectorFacts(
        kind=header_text(reader, kind_key),
        projection_dim=header_number(reader, "clip.vision.projection_dim"),
        weight_bytes=sum(int(t.n_bytes) for t in reader.tensors),
        image_size=header_number(reader, "clip.vision.image_size"),
        patch_size=header_number(reader, "clip.vision.patch_size"),
        width=header_number(reader, "clip.vision.embedding_length"),
        heads=header_number(reader, "clip.vision.attention.head_count"),
        ffn=header_number(reader, "clip.vision.feed_forward_length"),
    )

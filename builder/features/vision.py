"""Images in a stack: the model's multimodal projector (`--mmproj`, a `clip` GGUF beside the model in its
directory, so the stack's one read-only mount carries both), checked against the model before anything
is written, and the memory it takes counted by the plan.

Both llama.cpp engines load the projector with the model and put it on the GPU when the stack has one
(their --mmproj-offload default): its weights and the vision tower's compute buffer sit beside the
model's plan. An image in a chat request becomes the projector's tokens in the prompt (the suite's tiny
InternVL projector: 16 tokens for a 64-pixel image; a real one hundreds to thousands), prefilled as any.
"""

from __future__ import annotations

from typing import ClassVar

from builder.engines.base import Engine, StackSpec
from builder.errors import SpecError
from builder.features import Feature, Where
from builder.files import check_beside_model, user_path
from builder.models.opened import OpenedModel
from builder.models.projector import read_projector
from builder.spec import EngineOptions, NeutralOptions


class Vision(Feature):
    refusals: ClassVar[dict[Where, str]] = {
        "router": "images (--mmproj) are for a stack of one model: emit that model's stack on its own",
    }

    def asked(self, stack: StackSpec) -> bool:
        return stack.mmproj is not None

    def host_bytes(self, stack: StackSpec) -> int:
        """A CPU-only stack's projector (a GPU stack's is on the GPU)."""
        return projector_bytes(stack) if stack.gpu == "none" else 0


def checked_projector(options: EngineOptions, model: OpenedModel, adapter: Engine) -> EngineOptions:
    """`options` with the projector's path resolved, once it fits `model`: one line naming the problem
    otherwise (not a vision projector, elsewhere than the model's directory, made for a model of
    another width)."""
    if options.mmproj is None:
        return options
    check_beside_model(user_path(options.mmproj), model.path, "vision projector")
    projector = adapter.model_format.check(user_path(options.mmproj))
    facts, width = read_projector(projector), model.facts.hidden
    if facts.projection_dim != width:
        raise SpecError(
            f"the projector {projector.name} writes {facts.projection_dim}-wide embeddings and {model.name} "
            f"is {width} wide: give the mmproj made for this model (the engines refuse this one)"
        )
    return options.model_copy(update={"mmproj": projector})


def projector_bytes(options: NeutralOptions) -> int:
    """Memory the projector takes beside the model's plan (its weights and the vision tower's buffer; on
    the GPU in a GPU stack, else in RAM); 0 without one."""
    if options.mmproj is None:
        return 0
    facts = read_projector(options.mmproj)
    return facts.weight_bytes + facts.encoder_buffer_bytes

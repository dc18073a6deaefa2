"""What to build (ImageSpec) and what to run (StackSpec), each holding its engine's adapter: validated
from the engine's name where one is read (an option, a stack file, an image label), written as the name.

Every model forbids unknown fields; cross-field rules live in validators whose messages name the
field and the fix, so the CLI can show them as one line.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from builder.engines import EngineField
from builder.engines.base import Engine
from builder.models.kv_cache import DEFAULT_UBATCH, kv_cache_bytes
from builder.models.opened import OpenedModel
from builder.request import ContainerOptions, EnginePlacement, ServedOptions
from builder.spec import (
    DEFAULT_BASES,
    NO_CUDA,
    BaseImages,
    CpuTarget,
    CudaTarget,
    EngineOptions,
    EngineSource,
    NeutralOptions,
    NumaPolicy,
)

# A stack that keeps its prompts and unloads when idle saves its slots after this share of the idle
# unload without a request (a quarter: the save then always comes before the server's own timer runs out,
# which the save restarts), and takes an idle unload of at least this many seconds (the helper looks
# once a second).
QUIET_SHARE = 4
MIN_IDLE_WITH_PROMPTS = 4


class ImageSpec(BaseModel):
    """One image: engine × source × CUDA target × CPU target, on given base images."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    engine: EngineField
    source: EngineSource
    cpu: CpuTarget
    cuda: CudaTarget = NO_CUDA
    base: BaseImages = DEFAULT_BASES  # None fields: the toolchain's defaults
    registry: str = "ghcr.io"
    namespace: str = "moe-stack"
    # The tools image: the server image plus the engine's benchmark, quantize and GGUF tools, built
    # from the same build stage (same -march, same ISA guard) and published as `<slug>-tools`.
    tools: bool = False

    @property
    def ref(self) -> str:
        return self.source.ref


class StackSpec(NeutralOptions, ServedOptions, ContainerOptions, EnginePlacement):
    """A compose stack serving one GGUF model from one image: the request's groups as given (the neutral
    options, the server's and the container's, declared once in spec.py and request.py), what the stack
    decided for the engine (EnginePlacement), and the rest decided here."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    project: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    engine: EngineField
    image: str
    model: OpenedModel  # a path given here is taken as the engine's format names it, unread
    # Host placement: numactl policy applied by the image's entrypoint, the CPUs the container may
    # use (physical cores of the chosen NUMA nodes, cpuset syntax), GPU passthrough.
    numa: NumaPolicy = "none"
    numa_nodes: tuple[int, ...] = ()  # for membind/cpunodebind
    # NUMA nodes the stack's CPUs span: KTransformers runs one CPU thread pool per node.
    numa_node_count: int = Field(default=1, ge=1)
    cpuset: str | None = Field(default=None, pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$")
    gpu_ids: tuple[int, ...] = ()  # the GPUs the container gets, by device index (empty: all)
    # VRAM the placement leaves free on each GPU: the plan's (--fit-vram-gb) or the engine's own fit.
    vram_margin_mib: int = Field(default=1024, ge=0)
    # The model's attention keeps a sliding window in some layers (its GGUF's attention.sliding_window):
    # read where it matters, for --keep-prompts.
    sliding_window: bool = False
    # The model routes its experts within groups that this engine applies only when asked
    # (Engine.groups_on_request): the stack asks, so the model routes as it was trained.
    grouped_routing: bool = False
    # No preset named: what the options were derived from and what they set (x-moe-stack.derived).
    derived: str | None = None
    start_period_s: int = Field(default=120, ge=5)

    @property
    def prompts_saved_after_s(self) -> int | None:
        """A stack that keeps its prompts and unloads when idle: the seconds without a request after which
        the image's helper saves the slots, before the server sleeps and frees them (None: saved when the
        container stops only)."""
        if not self.keep_prompts or self.idle_unload is None:
            return None
        return max(1, self.idle_unload // QUIET_SHARE)

    @property
    def server_sleep_s(self) -> int | None:
        """The server's own idle timer (`--sleep-idle-seconds`): the save restarts it, so it runs for what
        is left of the idle unload after the save, and the server still sleeps `idle_unload` after the last
        request."""
        if self.idle_unload is None:
            return None
        return self.idle_unload - (self.prompts_saved_after_s or 0)

    @property
    def swa_full(self) -> bool:
        """Whether a sliding-window model's cache keeps every layer at the full context on mainline."""
        return keeps_whole_window(self.keep_prompts, self.extra_args)

    def kv_bytes(self) -> int:
        """The KV cache (and recurrent state) the stack's engine keeps for its model as it loads it, at the
        stack's context, cache types, slots and micro-batch."""
        return kv_cache_bytes(
            self.engine.loaded_model(self.model, self.mtp),
            self.ctx_size,
            self.cache_type or "f16",
            self.engine.cache_layout(self.mla, self.swa_full),
            self.parallel,
            self.cache_type_v,
            self.ubatch_size or DEFAULT_UBATCH,
        )

    def with_options(self, options: EngineOptions) -> StackSpec:
        """This stack with `options` as its engine options (validated again as a whole)."""
        return StackSpec.model_validate(self.model_dump() | options.model_dump())

    @model_validator(mode="after")
    def _consistent(self) -> StackSpec:
        if self.mmap is False and self.hugetlbfs != "off":
            raise ValueError(
                "--no-mmap reads the model into the engine's memory, so a hugetlbfs copy (which backs the "
                "mmap) would go unused: drop --hugetlbfs, or give --mmap"
            )
        if self.numa in ("membind", "cpunodebind") and not self.numa_nodes:
            raise ValueError(f"numa policy {self.numa} needs the nodes to bind to, e.g. --numa-nodes 0")
        if (self.gpu_ids or self.tensor_split or self.engine_fit) and self.gpu == "none":
            raise ValueError(
                "--gpus, a multi-GPU plan and --placement fit need a GPU: give --gpu nvidia or cdi"
            )
        if self.tensor_split and self.gpu_ids and len(self.tensor_split) != len(self.gpu_ids):
            raise ValueError(
                f"the plan is for {len(self.tensor_split)} GPUs and --gpus names {len(self.gpu_ids)}: "
                "give one --fit-vram-gb size per GPU"
            )
        if self.engine_fit and (self.override_tensors or self.gpu_layers is not None):
            raise ValueError(
                "--placement fit leaves -ngl and -ot to the engine: drop --override-tensor, "
                "--experts-on-cpu, --fit-vram-gb and --gpu-layers"
            )
        if (
            self.batch_size is not None
            and self.ubatch_size is not None
            and self.ubatch_size > self.batch_size
        ):
            raise ValueError(
                f"ubatch_size {self.ubatch_size} is larger than batch_size {self.batch_size}: a physical "
                "batch is part of a logical one; raise --batch-size or lower --ubatch-size"
            )
        if self.keep_prompts and self.idle_unload is not None and self.idle_unload < MIN_IDLE_WITH_PROMPTS:
            raise ValueError(
                f"--idle-unload {self.idle_unload}s leaves no time to save the prompt cache before the "
                f"server sleeps: give at least {MIN_IDLE_WITH_PROMPTS}s, or drop --keep-prompts"
            )
        if self.hugepages and self.hugetlbfs != "off":
            raise ValueError(
                "--hugepages (the engine maps hugepages itself) and --hugetlbfs (the model is copied "
                "onto a hugetlbfs volume) are two ways to the same pool: pick one"
            )
        return self

    @field_validator("model", mode="before")
    @classmethod
    def _opened(cls, model: object, info: ValidationInfo) -> object:
        engine = info.data.get("engine")
        if isinstance(model, str | Path) and isinstance(engine, Engine):
            return OpenedModel(Path(model), engine.model_format)
        return model


def keeps_whole_window(keep_prompts: bool, extra_args: tuple[str, ...]) -> bool:
    """Whether mainline caches sliding-window layers at the full context (--swa-full): a kept prompt cache
    needs it to restore such a model's slots (the adapter then gives it), or the user gave it."""
    return keep_prompts or "--swa-full" in extra_args

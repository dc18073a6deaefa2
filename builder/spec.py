"""Typed values the specs are made of: sources, CPU and CUDA targets, base images, the neutral engine
options (what to build and run, ImageSpec and StackSpec, hold their engine's adapter: engines/base.py).

Every model forbids unknown fields; cross-field rules live in validators whose messages name the
field and the fix, so the CLI can show them as one line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

# An engine's name (its adapter, builder.engines, says which exist and what each can build).
EngineName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")]

# A ref becomes part of an image tag: keep to the characters a tag allows.
_REF = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,100}$")
# A full commit id (tags shorten it, clones fetch it by id).
FULL_SHA = re.compile(r"^[0-9a-f]{40}$")

# All routed experts in CPU RAM (the seed's rule): the gate/up/down expert tensors of every layer.
EXPERTS_ON_CPU_RULE = r"blk\.[0-9]+\.ffn_.*_exps\.weight=CPU"


class Strict(BaseModel):
    """A model whose copies take its own fields alone: pydantic's model_copy(update=) sets whatever key it
    is given, a misspelt or renamed one silently (a copy with an `image` the spec no longer has)."""

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        unknown = sorted(set(update or ()) - set(type(self).model_fields))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(unknown)}")
        return super().model_copy(update=update, deep=deep)


class _Spec(Strict):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_ref(ref: str) -> str:
    if not _REF.fullmatch(ref):
        raise ValueError(
            f"{ref!r} must be 1-101 characters of letters, digits, '_', '.', '-' (it becomes part "
            "of the image tag)"
        )
    return ref


class GitSource(_Spec):
    """Upstream git repository at a pinned ref (tag, branch or commit); cloned inside the build."""

    kind: Literal["git"] = "git"
    url: str
    ref: str

    _ref = field_validator("ref")(_check_ref)


class LocalSource(_Spec):
    """An engine tree on this machine (a directory, a tarball, or an sdist that vendors it), or for
    KTransformers a wheelhouse (a directory of wheels, installed without an index).

    `ref` labels the image, since a local tree carries no trustworthy version of its own.
    """

    kind: Literal["local"] = "local"
    path: Path
    ref: str = "local"
    holds: Literal["tree", "wheels"] = "tree"

    _ref = field_validator("ref")(_check_ref)


class PypiSource(_Spec):
    """Released wheels from PyPI (or the index pip is pointed at) at version `ref`: KTransformers'
    default, since kt-kernel's wheels already carry every CPU variant."""

    kind: Literal["pypi"] = "pypi"
    ref: str

    _ref = field_validator("ref")(_check_ref)


EngineSource = Annotated[GitSource | LocalSource | PypiSource, Field(discriminator="kind")]


class CpuTarget(_Spec):
    """A CPU instruction-set target: how to compile for it and what a host must have to run it."""

    name: str
    march: str | None  # None: no -march at all (runtime dispatch picks the code path)
    required_flags: tuple[str, ...]
    ggml_features: tuple[str, ...]
    min_gcc: tuple[int, int]  # the oldest GCC that knows `march`
    runtime_dispatch: bool = False
    description: str


# CUDA toolkits the model accepts; the images and compilers for each are in builder.platform.toolchain.
CUDA_VERSIONS: tuple[str, ...] = ("12.4", "12.6", "12.8", "13.0")
# GPU archs by compute capability: 86 RTX 3090, 89 RTX 4090, 90 H100/H200, 100 B200, 120 RTX 5090.
GPU_ARCHS: tuple[int, ...] = (75, 80, 86, 89, 90, 100, 120)
# CUDA 12.8 is the first toolkit that knows the Blackwell archs.
_MIN_CUDA_FOR_ARCH: dict[int, tuple[int, int]] = {120: (12, 8), 100: (12, 8)}


def cuda_knows_arch(version: str, arch: int) -> bool:
    """Whether CUDA `version`'s nvcc compiles for GPU arch `arch` (sm_120 needs 12.8)."""
    need = _MIN_CUDA_FOR_ARCH.get(arch)
    return need is None or _version_tuple(version) >= need


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


class CudaTarget(_Spec):
    """`version=None` is a CPU-only image; otherwise a CUDA toolkit plus the GPU archs to compile."""

    version: str | None = None
    archs: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return "cpu" if self.version is None else f"cuda{self.version}"

    @model_validator(mode="after")
    def _consistent(self) -> CudaTarget:
        if self.version is None:
            if self.archs:
                raise ValueError("cuda.archs given for a CPU-only image: set cuda.version or drop the archs")
            return self
        if self.version not in CUDA_VERSIONS:
            raise ValueError(
                f"cuda.version {self.version} is not supported: choose one of {', '.join(CUDA_VERSIONS)}"
            )
        if not self.archs:
            raise ValueError("cuda.archs is empty: name the GPU archs to compile, e.g. 89 for an RTX 4090")
        for arch in self.archs:
            if arch not in GPU_ARCHS:
                raise ValueError(f"GPU arch {arch} is unknown: choose from {', '.join(map(str, GPU_ARCHS))}")
            if not cuda_knows_arch(self.version, arch):
                need = _MIN_CUDA_FOR_ARCH[arch]
                raise ValueError(
                    f"GPU arch {arch} needs CUDA >= {need[0]}.{need[1]}, not {self.version}: "
                    "pick a newer cuda.version or drop the arch"
                )
        return self


# An image reference ([registry[:port]/]path[:tag][@sha256:digest]), as Docker's reference grammar has it:
# it is written into FROM lines, so nothing else (a newline would start a Dockerfile instruction).
_IMAGE_REF = re.compile(
    r"(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]+)?/)?[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)


def _check_image_ref(ref: str | None) -> str | None:
    if ref is not None and not _IMAGE_REF.fullmatch(ref):
        raise ValueError(
            f"{ref!r} is not an image reference (like debian:trixie-slim or "
            "mirror.local:5000/nvidia/cuda:13.0.1-devel-ubuntu24.04)"
        )
    return ref


class BaseImages(_Spec):
    """Base image per stage, so a local mirror or a locally made base (`moe-stack base`) can be used.

    None means the default for the image's CUDA target (builder.platform.toolchain picks it).
    """

    build: str | None = None
    runtime: str | None = None
    # Where a CUDA image's toolkit comes from: NVIDIA's `nvidia/cuda` images (pulled), or the
    # `moe-stack/cuda` images `moe-stack base --cuda` assembles from NVIDIA's PyPI wheels (13.0) or
    # Debian's non-free archive (12.4).
    cuda: Literal["nvidia", "pypi", "debian"] = "nvidia"

    _refs = field_validator("build", "runtime")(_check_image_ref)


NO_CUDA = CudaTarget()  # a CPU-only image
DEFAULT_BASES = BaseImages()  # every stage on its toolchain's default image


# KV cache element types either llama.cpp engine takes (-ctk/-ctv); each adapter says which its engine
# has (Engine.cache_types); their sizes are in models.planner.
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl", "q6_0", "q8_KV"]
# kt-kernel 0.7.2's inference backends (sglang-kt --kt-method; kt_kernel/experts.py): only LLAMAFILE
# reads GGUF; AMXINT4/AMXINT8 read weights converted by kt-kernel and need AMX; the others read
# safetensors (Hugging Face FP8/BF16/INT4 checkpoints, or kt-kernel's MOE_INT4/8 conversions).
KtMethod = Literal[
    "LLAMAFILE", "AMXINT4", "AMXINT8", "MOE_INT4", "MOE_INT8", "RAWINT4", "FP8", "FP8_PERCHANNEL", "BF16",
    "GPTQ_INT4", "MXFP4", "NVFP4", "MXFP8",
]  # fmt: skip


FlashAttention = Literal["on", "off", "auto"]
# A reasoning model's thinking (its <think> before the answer): on, off, or auto (the chat template's own
# default). At 5-20 tok/s of hybrid decode it is the largest latency lever a user has.
Thinking = Literal["on", "off", "auto"]
# The effort gpt-oss's template reads (`reasoning_effort`; OpenAI's default medium).
ReasoningEffort = Literal["low", "medium", "high"]
# Where the llama.cpp engines return a reply's thoughts (common_reasoning_format_from_name in both at their
# pins): none (left in the content), deepseek (reasoning_content), deepseek-legacy (both), auto.
ReasoningFormat = Literal["auto", "none", "deepseek", "deepseek-legacy"]
# How the image's entrypoint places the engine's memory and threads with numactl.
NumaPolicy = Literal["none", "interleave", "membind", "cpunodebind"]


_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?")


def duration_seconds(text: str) -> int | None:
    """`20m`, `90s`, `1h`, `1h30m` or plain seconds → seconds (None: not a duration)."""
    found = _DURATION.fullmatch(text.strip())
    if not text.strip() or found is None:
        return None
    hours, minutes, seconds = (int(part or 0) for part in found.groups())
    return hours * 3600 + minutes * 60 + seconds


def _seconds(value: object) -> object:
    if isinstance(value, str):
        seconds = duration_seconds(value)
        if seconds is None:
            raise ValueError(f"{value!r} is not a duration such as 90s, 10m or 1h30m")
        return seconds
    return value


# A duration as the user writes it (10m, 90s, 1h30m or seconds), held as whole seconds.
Seconds = Annotated[int, BeforeValidator(_seconds)]
_SIZE = re.compile(r"(\d+)([mg]?)i?b?", re.IGNORECASE)


def _mebibytes(value: object) -> object:
    if isinstance(value, str):
        found = _SIZE.fullmatch(value.strip())
        if found is None:
            raise ValueError(f"{value!r} is not a size such as 8g, 512m or 0")
        return int(found[1]) * (1024 if found[2].lower() == "g" else 1)
    return value


# A size as the user writes it (8g, 512m; a bare number is MiB), held as MiB.
Mebibytes = Annotated[int, BeforeValidator(_mebibytes)]


def option(
    default: Any,
    *flags: str,
    help: str,
    ge: float | None = None,
    le: float | None = None,
    pattern: str | None = None,
    validate_default: bool = False,
) -> Any:
    """An option's one declaration: its default and limits, and how the command line spells it
    (`flags`: typer's declarations, e.g. "--ctx-size", "-c" or "--mmap/--no-mmap") with its help
    (`validate_default`: the default is given as the command line gives it, e.g. an engine's name)."""
    spelled: dict[str, Any] = {"flags": list(flags)}
    return Field(
        default=default,
        description=help,
        json_schema_extra=spelled,
        ge=ge,
        le=le,
        pattern=pattern,
        validate_default=validate_default,
    )


class NeutralOptions(_Spec):
    """The neutral engine options, declared once with their limits and command-line spellings (None:
    the engine's default): a preset and the command line give them as EngineOptions, a stack holds
    them (StackSpec); each engine's adapter writes them in its own version's syntax."""

    ctx_size: int = option(
        4096, "--ctx-size", "-c", help="context length (default: the preset's, else 4096)", ge=128
    )
    cache_type: CacheType | None = option(None, "--cache-type", help="KV cache type for K and V, e.g. q8_0")
    cache_type_v: CacheType | None = option(
        None, "--cache-type-v", help="V's cache type where it differs from K's (--cache-type)"
    )
    # -ngl: 99 puts every layer's attention on the GPU
    gpu_layers: int | None = option(None, "--gpu-layers", "-ngl", help="layers on the GPU (99: all)", ge=0)
    flash_attention: FlashAttention | None = option(
        None, "--flash-attention", help="on, off or auto (written as this engine version wants it)"
    )
    fused_moe: bool | None = option(
        None, "--fused-moe/--no-fused-moe", help="ik_llama.cpp's fused MoE (default: the engine's)"
    )
    mla: int | None = option(None, "--mla", help="ik_llama.cpp MLA mode 0-3 (DeepSeek models)", ge=0, le=3)
    # ik_llama.cpp: move a batch's CPU-resident expert matmuls to the GPU once batch × used experts ≥
    # this × all experts (its default 32 needs 512-token batches at 8 of 128 experts; 2 matches mainline).
    moe_offload_batch: int | None = option(
        None,
        "--moe-offload-batch",
        help="ik_llama.cpp: prefill batches of CPU experts go to the GPU from this size (32 × used / all "
        "experts matches mainline)",
        ge=1,
    )
    # ik_llama.cpp's graph split (`-sm graph`): each layer's tensors and compute over a multi-GPU plan's
    # GPUs instead of whole layers per GPU. Never a default: no run on two GPUs has tried it yet.
    split_mode_graph: bool | None = option(
        None,
        "--split-mode-graph/--no-split-mode-graph",
        help="ik_llama.cpp: split each layer's tensors and compute over a multi-GPU plan's GPUs "
        "(--split-mode graph -smgs) instead of whole layers per GPU; not yet run on two GPUs",
    )
    # KTransformers: how kt-kernel computes the CPU experts (LLAMAFILE reads GGUF; the AMX methods
    # read weights converted by kt-kernel).
    kt_method: KtMethod | None = option(
        None,
        "--kt-method",
        help="KTransformers CPU expert backend: LLAMAFILE (GGUF, any AVX2+ CPU; default), AMXINT4 or "
        "AMXINT8 (converted weights, AMX)",
    )
    # KTransformers (SGLang): the parsers that split a reply's reasoning (`<think>`) into
    # reasoning_content and its tool calls into tool_calls (server_args.py's --reasoning-parser and
    # --tool-call-parser of sglang-kt 0.7.2; its --help lists the choices, which compose checks).
    reasoning_parser: str | None = option(
        None,
        "--reasoning-parser",
        help="KTransformers: the reasoning parser, e.g. deepseek-r1, qwen3 (default: the preset's)",
        pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$",
    )
    tool_call_parser: str | None = option(
        None,
        "--tool-call-parser",
        help="KTransformers: the tool-call parser, e.g. deepseekv3, qwen (default: the preset's)",
        pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$",
    )
    # Reasoning, engine-neutral: each adapter writes it in its engine's syntax (engines/reasoning.py), and a
    # preset refuses what its model can't do (R1 can't stop thinking; Qwen3-Next Instruct can't start).
    thinking: Thinking | None = option(
        None,
        "--thinking",
        help="a reasoning model thinks before it answers: on, off or auto (its chat template's default; "
        "default: the preset's)",
    )
    reasoning_budget: int | None = option(
        None,
        "--reasoning-budget",
        help="most tokens a reply thinks (-1: no limit, 0: none; ik_llama.cpp takes -1 or 0 only)",
        ge=-1,
    )
    reasoning_effort: ReasoningEffort | None = option(
        None,
        "--reasoning-effort",
        help="low, medium or high, for templates that read it (gpt-oss; default: the preset's)",
    )
    reasoning_format: ReasoningFormat | None = option(
        None,
        "--reasoning-format",
        help="where the llama.cpp engines return thoughts: deepseek (reasoning_content), none (in the "
        "content), deepseek-legacy (both) or auto (default: the engine's)",
    )
    # False: read the weights into the engine's own memory instead of mmapping the file (mainline
    # llama.cpp then keeps the CPU-side weights in the GPU's pinned host memory: faster prefill offload).
    mmap: bool | None = option(
        None,
        "--mmap/--no-mmap",
        help="map the model file (the engine's default) or read it into the engine's memory; mainline "
        "llama.cpp then keeps CPU weights in pinned memory: hybrid prefill 2.4-3x on the device "
        "(default: the preset's)",
    )
    # Server-side sampling defaults (a request's own values still win; model cards: R1 0.6 / top-p
    # 0.95; Qwen3 0.6 / 0.95 / top-k 20 / min-p 0) and batch sizes (larger -ub speeds hybrid prefill,
    # ik PR #728).
    temperature: float | None = option(
        None,
        "--temperature",
        help="server-side default temperature (default: the preset's, else the engine's)",
        ge=0,
        le=5,
    )
    top_p: float | None = option(None, "--top-p", help="server-side default top-p", ge=0, le=1)
    top_k: int | None = option(None, "--top-k", help="server-side default top-k", ge=0)
    min_p: float | None = option(None, "--min-p", help="server-side default min-p", ge=0, le=1)
    batch_size: int | None = option(
        None,
        "--batch-size",
        "-b",
        help="logical batch size (default: the preset's, else the engine's)",
        ge=1,
    )
    ubatch_size: int | None = option(
        None,
        "--ubatch-size",
        "-ub",
        help="physical batch size; larger speeds hybrid prefill and takes more VRAM",
        ge=1,
    )
    # Both llama.cpp engines keep prompts' KV state in host RAM for reuse, 8 GiB unless told (-cram).
    cache_ram: Mebibytes | None = option(
        None,
        "--cache-ram",
        help="host RAM for the engine's prompt cache, e.g. 8g (both llama.cpp engines' default) or 0 (none)",
        ge=0,
    )
    # Mainline llama.cpp's --sleep-idle-seconds: the server frees the model and its context when idle
    # (in a router stack, each model's server does), and loads it again on the next request.
    idle_unload: Seconds | None = option(
        None,
        "--idle-unload",
        help="free the model after this long without a request (e.g. 10m; mainline llama.cpp); the next "
        "request loads it again",
        ge=1,
    )

    # Speculative decoding: a small draft model of the model's vocabulary proposes tokens that the model
    # checks in one batch (both llama.cpp engines' -md), or the model's own multi-token-prediction
    # layer drafts them (mainline's --spec-type draft-mtp: DeepSeek-V3/R1 and Qwen3-Next GGUFs that
    # carry it; ik_llama.cpp's -mtp is GLM-4.5's only).
    draft_model: Path | None = option(
        None,
        "--draft-model",
        help="a small GGUF of the same vocabulary, in the model's directory, that drafts tokens for "
        "the model to verify (speculative decoding; on the GPU with the attention)",
    )
    mtp: bool | None = option(
        None,
        "--mtp/--no-mtp",
        help="draft with the model's own multi-token-prediction layer (a GGUF that carries it; mainline "
        "llama.cpp)",
    )
    draft_max: int | None = option(
        None, "--draft-max", help="most tokens drafted a step (default: the engine's)", ge=1, le=64
    )
    # Images: the model's multimodal projector (a `clip` GGUF: its vision tower), loaded beside the model
    # (both llama.cpp engines' --mmproj); chat requests may then carry images (features/vision.py).
    mmproj: Path | None = option(
        None,
        "--mmproj",
        help="the model's vision projector (mmproj-*.gguf, in the model's directory): chat requests may "
        "carry images (on the GPU with the attention)",
    )

    @model_validator(mode="after")
    def _thinking_and_budget(self) -> NeutralOptions:
        """A budget says how long a reply thinks: none for one that doesn't think, not none for one that
        must."""
        budget = self.reasoning_budget
        if self.thinking == "off" and budget not in (None, 0):
            raise ValueError(
                f"--thinking off with --reasoning-budget {budget}: a reply that doesn't think has no "
                "thinking to budget; drop --reasoning-budget"
            )
        if self.thinking == "on" and budget == 0:
            raise ValueError("--thinking on with --reasoning-budget 0 (no thinking): drop one of them")
        return self


class EngineOptions(NeutralOptions):
    """The neutral options a preset or the command line gives."""

    def over(self, base: EngineOptions) -> EngineOptions:
        """`base` with the options set here (given explicitly, even as None) replacing its own."""
        return base.model_copy(update=self.model_dump(exclude_unset=True))

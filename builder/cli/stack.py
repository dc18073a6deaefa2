"""`moe-stack compose | up | bench | down | demo`: stacks, from emission to a running, measured
engine. Registered on the app by cli.py; each verb is a thin layer over compose.py, stack.py,
benchmark.py or demo.py."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from builder.cli.common import EngineOpt, PresetsFileOpt, float_list, int_list, out, text_table
from builder.cli.neutral import given_options, takes_neutral_options
from builder.cli.progress import build_display
from builder.engines import engine_names, get_engine
from builder.errors import SpecError
from builder.files import write_file_atomically
from builder.host.probe import probe
from builder.images.baseimage import ensure_base
from builder.images.build import build_image
from builder.images.naming import image_spec
from builder.images.source import resolve_local
from builder.models.planner import DEFAULT_VRAM_MARGIN, GIB
from builder.spec import BaseImages, duration_seconds
from builder.stacks.assemble import StackOptions, StackPlan, check_ports, plan_models
from builder.stacks.benchmark import measure
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.demo import DEMO_PROMPT, complete, start_demo
from builder.stacks.host_checks import check_port_free
from builder.stacks.kubernetes import KubeOptions, manifests, resource_name, to_kubernetes_yaml
from builder.stacks.memory_use import memory_use
from builder.stacks.run import down as stack_down
from builder.stacks.run import published_ports, stack_api_key
from builder.stacks.run import up as stack_up
from builder.stacks.smoke import smoke as run_smoke
from builder.stacks.stack_file import StackFile
from builder.stacks.tool_run import bench_with_tool, engine_service_name
from builder.stacks.tune import Objective
from builder.stacks.tune_plot import plot
from builder.stacks.tune_stack import tune_stack, tuned_document


@takes_neutral_options
def compose(
    model: Annotated[
        list[Path],
        typer.Option(
            "--model",
            "-m",
            help="the GGUF file to serve (its directory is mounted read-only); repeat it for several models "
            "behind one server (llama.cpp's router: one loaded at a time)",
        ),
    ],
    engine: EngineOpt = "llama.cpp",
    image: Annotated[
        str | None,
        typer.Option(
            "--image",
            help="image to run (default: the pinned image of the engine's default CPU target: avx2; "
            "KTransformers: portable)",
        ),
    ] = None,
    out_file: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="file to write (default: compose.yaml, or moe-stack.k8s.yaml with --format kubernetes)",
        ),
    ] = None,
    output_format: Annotated[
        str,
        typer.Option(
            "--format", help="compose, or kubernetes (a Deployment and a Service from the same stack)"
        ),
    ] = "compose",
    replicas: Annotated[
        int,
        typer.Option("--replicas", help="kubernetes: pods behind the Service (each holds the whole model)"),
    ] = 1,
    model_pvc: Annotated[
        str | None,
        typer.Option(
            "--model-pvc",
            help="kubernetes: a PersistentVolumeClaim holding the model (default: the node's directory, "
            "hostPath)",
        ),
    ] = None,
    gpu_product: Annotated[
        str | None,
        typer.Option(
            "--gpu-product", help="kubernetes: nodes with this nvidia.com/gpu.product, e.g. NVIDIA-H200"
        ),
    ] = None,
    project: Annotated[str | None, typer.Option("--project", help="compose project name")] = None,
    port: Annotated[int, typer.Option("--port", help="host port")] = 8080,
    bind: Annotated[
        str, typer.Option("--bind", help="host address to publish on (0.0.0.0 exposes it to the network)")
    ] = "127.0.0.1",
    preset: Annotated[
        list[str] | None,
        typer.Option(
            "--preset",
            help="model preset from compose/presets.yaml, e.g. deepseek-r1-671b; with several --model, one "
            "per model in the same order",
        ),
    ] = None,
    presets_file: PresetsFileOpt = None,
    threads: Annotated[
        int | None, typer.Option("--threads", "-t", help="engine threads (default: physical cores)")
    ] = None,
    parallel: Annotated[int, typer.Option("--parallel", help="server slots (concurrent requests)")] = 1,
    override_tensor: Annotated[
        list[str] | None, typer.Option("--override-tensor", "-ot", help="REGEX=BUFTYPE, repeatable")
    ] = None,
    experts_on_cpu: Annotated[
        bool, typer.Option("--experts-on-cpu", help="keep routed experts (ffn_*_exps) in CPU RAM")
    ] = False,
    fit_vram_gb: Annotated[
        str | None,
        typer.Option(
            "--fit-vram-gb",
            help="plan expert placement for this much VRAM (moe-stack plan): each GPU's first layers' "
            "experts go to it; several GPUs: one size each, e.g. 24,24 (adds -ts)",
        ),
    ] = None,
    vram_margin_gb: Annotated[
        float,
        typer.Option(
            "--vram-margin-gb",
            help="VRAM a --fit-vram-gb plan leaves free on each GPU, GiB (the engines' own fitting keeps 1)",
        ),
    ] = DEFAULT_VRAM_MARGIN / GIB,
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="the GPUs the stack gets, by index, e.g. 0,1 (default: all)")
    ] = None,
    placement: Annotated[
        str,
        typer.Option(
            "--placement",
            help="rules (moe-stack's plan: -ngl and -ot rules) or fit (the llama.cpp engine's own --fit, "
            "leaving --vram-margin-gb free)",
        ),
    ] = "rules",
    chat_template: Annotated[
        str | None,
        typer.Option(
            "--chat-template",
            help="built-in chat template name (e.g. gemma) or a Jinja template, for GGUFs without one",
        ),
    ] = None,
    served_name: Annotated[
        str | None,
        typer.Option(
            "--served-name",
            help="the model's name in the API (default: the preset's name, else the model's file name "
            "without its split suffix)",
        ),
    ] = None,
    jinja: Annotated[
        bool,
        typer.Option(
            "--jinja/--no-jinja",
            help="the model's Jinja chat template (tool calls, thinking); on where the image has it",
        ),
    ] = True,
    metrics: Annotated[
        bool,
        typer.Option(
            "--metrics/--no-metrics",
            help="the engine's Prometheus endpoint /metrics; on where the image has it",
        ),
    ] = True,
    monitoring: Annotated[
        bool,
        typer.Option(
            "--monitoring",
            help="add a Prometheus service scraping the engine (its image: `moe-stack base --prometheus`)",
        ),
    ] = False,
    monitoring_port: Annotated[
        int, typer.Option("--monitoring-port", help="host port of Prometheus' UI, with --monitoring")
    ] = 9090,
    numa: Annotated[
        str,
        typer.Option(
            "--numa",
            help="auto, none, interleave, membind or cpunodebind (auto: interleave on multi-node hosts)",
        ),
    ] = "auto",
    numa_nodes: Annotated[
        str | None, typer.Option("--numa-nodes", help="NUMA nodes to use, e.g. 0 or 0,1 (default: all)")
    ] = None,
    gpu: Annotated[str, typer.Option("--gpu", help="none, nvidia (device reservation) or cdi")] = "none",
    config_dir: Annotated[
        Path | None,
        typer.Option(
            "--config-dir",
            help="KTransformers: the model's Hugging Face directory (config.json, tokenizer), mounted "
            "read-only",
        ),
    ] = None,
    trust_remote_code: Annotated[
        bool,
        typer.Option(
            "--trust-remote-code",
            help="KTransformers: let the server run Python from --config-dir (a config's auto_map); off by "
            "default, as no preset's model needs it",
        ),
    ] = False,
    gpu_experts: Annotated[
        int | None,
        typer.Option(
            "--gpu-experts",
            help="KTransformers: experts per layer kept on the GPU (default: from --fit-vram-gb, else none)",
        ),
    ] = None,
    mlock: Annotated[
        bool, typer.Option("--mlock", help="lock the model in RAM (adds IPC_LOCK and unlimited memlock)")
    ] = False,
    hugepages: Annotated[
        bool,
        typer.Option("--hugepages", help="weights from the host's reserved hugepages (ik_llama.cpp -thp)"),
    ] = False,
    hugetlbfs: Annotated[
        str,
        typer.Option(
            "--hugetlbfs",
            help="copy the model onto a hugetlbfs volume of 2M or 1G pages at start (any engine; the pool "
            "must hold it)",
        ),
    ] = "off",
    shm_size: Annotated[str, typer.Option("--shm-size", help="size of /dev/shm, e.g. 1g")] = "1g",
    cpu_image: Annotated[
        str | None,
        typer.Option(
            "--cpu-image",
            help="with --gpu: also a CPU-only service from this image; the file gets compose profiles gpu "
            "and cpu",
        ),
    ] = None,
    api_key_file: Annotated[
        Path | None,
        typer.Option("--api-key-file", help="file with the API key(s), passed as a compose secret"),
    ] = None,
    skip_image_checks: Annotated[
        bool,
        typer.Option(
            "--skip-image-checks",
            help="don't read the image's flag contract and CPU needs (image not present here)",
        ),
    ] = False,
    for_other_host: Annotated[
        bool, typer.Option("--for-other-host", help="emit even if this host's CPU can't run the image")
    ] = False,
    start_period: Annotated[
        int | None,
        typer.Option("--start-period", help="seconds the model may take to load (default: from its size)"),
    ] = None,
    engine_args: Annotated[list[str] | None, typer.Argument(help="extra engine flags, after --")] = None,
    **neutral: Any,
) -> None:
    """Emit a compose file that serves MODEL with ENGINE's image."""
    if output_format not in ("compose", "kubernetes"):
        raise SpecError(f"--format {output_format!r}: choose compose or kubernetes")
    given = {name: value for name, value in locals().items() if name != "neutral"}
    options = _stack_options(given, neutral)
    plan = plan_models(options, probe())
    generated_by = " ".join(["moe-stack", *sys.argv[1:]])
    if output_format == "kubernetes":
        # its ports are the cluster's: none checked here
        cluster = KubeOptions(replicas=replicas, model_pvc=model_pvc, gpu_product=gpu_product)
        path = _write_kubernetes(plan, cluster, out_file or Path("moe-stack.k8s.yaml"), generated_by)
        out.print(f"wrote {path}: `kubectl apply -f {path}` runs it (a Deployment and a Service)")
        return
    document = compose_stack(
        plan.stack,
        generated_by=generated_by,
        facts=plan.facts,
        cpu_profile=plan.cpu_profile,
        routed=plan.routed,
    )
    check_ports(plan, options[0])
    path = write_stack(document, out_file or Path("compose.yaml"))
    for note in plan.notes:
        out.print(Text(f"note: {note}", style="yellow"), soft_wrap=True)
    out.print(f"wrote {path}: `docker compose -f {path} up --wait` starts it on http://{bind}:{port}")


# compose's options that are StackOptions fields under the same name, passed as given.
_AS_GIVEN = (
    "engine", "image", "cpu_image", "project", "port", "bind", "presets_file", "threads", "parallel",
    "experts_on_cpu", "vram_margin_gb", "placement", "chat_template", "served_name", "jinja", "metrics",
    "numa", "gpu", "config_dir", "trust_remote_code", "gpu_experts", "mlock", "hugepages", "hugetlbfs",
    "shm_size", "api_key_file", "skip_image_checks", "for_other_host",
)  # fmt: skip


def _stack_options(given: dict[str, Any], neutral: dict[str, Any]) -> list[StackOptions]:
    """compose's command line as one StackOptions a model: the fields named as the options are, then the
    options the command line spells otherwise (lists as text, a preset per model, the monitoring switch)."""
    models, presets = given["model"], list(given["preset"] or [])
    if presets and len(presets) != len(models):
        raise SpecError(
            f"{len(models)} --model and {len(presets)} --preset: give one preset per model, in the same "
            "order (or none)"
        )
    if given["served_name"] is not None and len(models) > 1:
        raise SpecError(
            "--served-name names one model; several models are served under their presets' names "
            "(else their file names)"
        )
    common = {name: given[name] for name in _AS_GIVEN} | {
        "engine_options": given_options(neutral),
        "override_tensors": tuple(given["override_tensor"] or ()),
        "fit_vram_gb": float_list(given["fit_vram_gb"], "--fit-vram-gb"),
        "ports_here": given["output_format"] == "compose",
        "gpus": int_list(given["gpus"], "--gpus"),
        "monitoring_port": given["monitoring_port"] if given["monitoring"] else 0,
        "numa_nodes": int_list(given["numa_nodes"], "--numa-nodes"),
        "start_period_s": given["start_period"],
        "engine_args": tuple(given["engine_args"] or ()),
    }
    return [
        StackOptions.model_validate(common | {"model": path, "preset": presets[index] if presets else None})
        for index, path in enumerate(models)
    ]


def _write_kubernetes(plan: StackPlan, cluster: KubeOptions, out_file: Path, generated_by: str) -> Path:
    """The plan as a Deployment and a Service (one model, no CPU profile); `cluster` holds compose's
    --replicas, --model-pvc and --gpu-product, the stack its memory and GPUs."""
    if plan.routed or plan.cpu_profile is not None:
        raise SpecError(
            "--format kubernetes emits one model's Deployment: drop --cpu-image and extra --model"
        )
    stack = plan.stack
    options = replace(cluster, memory=memory_use(stack), gpus=len(stack.gpu_ids) or 1)
    secret = f"{resource_name(stack.project)}-api-key" if stack.api_key_file is not None else None
    return write_file_atomically(
        out_file, to_kubernetes_yaml(manifests(stack, plan.facts, options), generated_by, secret)
    )


def up(
    compose_file: Annotated[Path, typer.Argument(help="compose file from `moe-stack compose`")] = Path(
        "compose.yaml"
    ),
    timeout: Annotated[int, typer.Option("--timeout", help="seconds to wait for healthy")] = 600,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="gpu or cpu, for a file emitted with --cpu-image (default: gpu)"),
    ] = None,
) -> None:
    """Start a stack and wait until the engine is healthy."""
    stack_up(compose_file, timeout, profile)
    out.print(f"healthy: {compose_file}")


def bench(
    compose_file: Annotated[
        Path, typer.Argument(help="compose file of the stack (started if it isn't running)")
    ] = Path("compose.yaml"),
    prompt_words: Annotated[
        int,
        typer.Option(
            "--prompt-words", "-p", help="prompt length (about one token per word; with --tool, tokens)"
        ),
    ] = 256,
    generate: Annotated[int, typer.Option("--generate", "-n", help="tokens to generate")] = 64,
    repetitions: Annotated[int, typer.Option("--repetitions", "-r", help="runs; the median is shown")] = 3,
    tool: Annotated[
        str | None,
        typer.Option(
            "--tool",
            help="llama-bench, or sweep-bench (ik_llama.cpp): the engine's own benchmark from the tools "
            "image, with the stack's flags, the stack stopped",
        ),
    ] = None,
    tools_image: Annotated[
        str | None,
        typer.Option(
            "--tools-image",
            help="with --tool: the tools image (default: the stack's image's repository with -tools, same "
            "tag)",
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="gpu or cpu, for a file emitted with --cpu-image (default: gpu)"),
    ] = None,
) -> None:
    """Prefill and decode tokens/s of a stack, as its engine reports them, with exactly the stack's flags."""
    if tool is not None:
        _bench_with_tool(compose_file, tool, tools_image, prompt_words, generate, repetitions, profile)
        return
    if tools_image is not None:
        raise SpecError("--tools-image goes with --tool llama-bench or --tool sweep-bench")
    stack_up(compose_file, 1800, profile)
    (bind, port), *_ = published_ports(compose_file)
    speed = measure(
        port,
        prompt_words,
        generate,
        repetitions,
        host="127.0.0.1" if bind == "0.0.0.0" else bind,
        api_key=stack_api_key(compose_file),
    )
    table = text_table("", "tokens", "median t/s", "runs t/s")
    table.add_row(
        "prefill",
        str(speed.prompt_tokens),
        f"{speed.prefill:.1f}",
        " ".join(f"{v:.1f}" for v in speed.prefill_tps),
    )
    table.add_row(
        "decode",
        str(speed.generated_tokens),
        f"{speed.decode:.1f}",
        " ".join(f"{v:.1f}" for v in speed.decode_tps),
    )
    out.print(table)


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")


def _bench_with_tool(
    compose_file: Path,
    tool: str,
    tools_image: str | None,
    prompt_tokens: int,
    generate: int,
    repetitions: int,
    profile: str | None,
) -> None:
    result = bench_with_tool(
        compose_file, tool, tools_image, prompt_tokens, generate, repetitions, profile, starting=_say
    )
    out.print(Text(f"{result.image}: {result.program} {' '.join(result.args)}", style="dim"), soft_wrap=True)
    for note in result.left_out:
        out.print(Text(f"not given to {result.program}: {note}", style="yellow"), soft_wrap=True)
    table = text_table("test", "depth", "mean t/s", "± sd", "runs t/s")
    for row in result.rows:
        table.add_row(
            row.test,
            str(row.depth),
            f"{row.tps:.1f}",
            f"{row.spread:.1f}",
            " ".join(f"{v:.1f}" for v in row.samples_tps),
        )
    out.print(table)


def tune(
    compose_file: Annotated[
        Path, typer.Argument(help="compose file of the stack (stopped: tune measures its model and cores)")
    ] = Path("compose.yaml"),
    budget: Annotated[
        str, typer.Option("--budget", help="how long the search may take, e.g. 20m, 90s, 1h")
    ] = "20m",
    decode: Annotated[bool, typer.Option("--decode", help="tune for decode speed only")] = False,
    prefill: Annotated[bool, typer.Option("--prefill", help="tune for prefill speed only")] = False,
    write: Annotated[
        bool,
        typer.Option(
            "--write", help="write the winner into FILE itself (default: FILE.tuned.yaml beside it)"
        ),
    ] = False,
    out_file: Annotated[
        Path | None, typer.Option("--out", "-o", help="where to write the tuned stack")
    ] = None,
    plot_file: Annotated[Path | None, typer.Option("--plot", help="also a PNG chart of every trial")] = None,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", "-p", help="prefill test length")] = 512,
    generate: Annotated[int, typer.Option("--generate", "-n", help="decode test length")] = 64,
    only: Annotated[
        str | None,
        typer.Option(
            "--only", help="tune these settings alone, comma-separated (e.g. fmoe,amb; default: all)"
        ),
    ] = None,
    tools_image: Annotated[
        str | None,
        typer.Option(
            "--tools-image", help="the tools image (default: the stack's image's repository with -tools)"
        ),
    ] = None,
    native_bin: Annotated[
        Path | None,
        typer.Option(
            "--native-bin",
            help="run native builds from this directory instead of the tools image (hosts without Docker)",
        ),
    ] = None,
    model_dir: Annotated[
        Path | None,
        typer.Option(
            "--model-dir", help="with --native-bin: the model's directory here (default: the stack's)"
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="gpu or cpu, for a file emitted with --cpu-image (default: gpu)"),
    ] = None,
) -> None:
    """Find this host's fastest settings for a stack (threads, batch sizes, mmap, ik_llama.cpp's repacking,
    fused MoE and offload batch, NUMA policy, a draft's length) with the engine's llama-bench (a drafting
    stack: its server, timing a completion), and write them into the stack."""
    if decode and prefill:
        raise SpecError("--decode and --prefill: give one, or neither to tune for both")
    objective: Objective = "decode" if decode else "prefill" if prefill else "both"
    if out_file is not None and write:
        raise SpecError("--write replaces FILE; --out writes elsewhere: give one")
    if model_dir is not None and native_bin is None:
        raise SpecError("--model-dir goes with --native-bin")
    tuned = tune_stack(
        compose_file,
        parse_duration(budget),
        objective,
        tools_image,
        native_bin,
        model_dir,
        profile,
        prompt_tokens,
        generate,
        tuple(name.strip() for name in only.split(",") if name.strip()) if only else (),
        progress=_say,
    )
    result = tuned.result
    table = text_table("#", "setting", "prefill t/s", "decode t/s", "s")
    for number, trial in enumerate(result.trials, 1):
        table.add_row(
            str(number),
            f"{trial.dimension}={trial.value}",
            f"{trial.prefill_tps:.1f}",
            f"{trial.decode_tps:.2f}",
            f"{trial.seconds:.0f}",
        )
    out.print(table)
    changed = {k: v for k, v in result.best.values.items() if v != result.baseline.values[k]}
    (pre_low, pre_high), (dec_low, dec_high) = result.ratio_spread
    out.print(
        f"{len(result.trials)} trials in {result.seconds:.0f} s; winner: "
        f"{', '.join(f'{k}={v}' for k, v in changed.items()) or 'the stack as it is'}",
        highlight=False,
    )
    if changed:
        out.print(
            f"tuned ÷ stack (confirm rounds, alternating): prefill {result.ratios[0]:.2f} "
            f"({pre_low:.2f}-{pre_high:.2f}), decode {result.ratios[1]:.2f} ({dec_low:.2f}-{dec_high:.2f})",
            highlight=False,
        )
    else:
        out.print(
            f"the stack's own trials (median): prefill {result.baseline_tps[0]:.1f} t/s, decode "
            f"{result.baseline_tps[1]:.2f} t/s",
            highlight=False,
        )
    if result.not_confirmed:
        out.print(
            Text(
                "not confirmed, so not taken: "
                f"{', '.join(f'{k}={v}' for k, v in result.not_confirmed.items())} "
                "(the confirm rounds measured it within noise of the stack)",
                style="yellow",
            ),
            soft_wrap=True,
        )
    for setting, why in result.failed.items():
        out.print(Text(f"failed, left out: {setting}: {why}", style="yellow"), soft_wrap=True)
    if result.skipped:
        out.print(Text(f"left out: {'; '.join(result.skipped)}", style="yellow"), soft_wrap=True)
    ratio = tuned.bound_ratio(result.tuned_tps[1])
    if ratio is not None:
        out.print(
            f"decode {result.tuned_tps[1]:.2f} t/s = {ratio:.2f} of the bandwidth bound "
            f"({tuned.bandwidth_gbps:.1f} GB/s ÷ {tuned.bytes_per_token / 1e6:.1f} MB read per token)",
            highlight=False,
        )
    document = StackFile.read(compose_file)
    name = engine_service_name(profile)
    target = compose_file if write else out_file or compose_file.with_suffix(".tuned.yaml")
    path = write_stack(tuned_document(document, name, tuned, " ".join(["moe-stack", *sys.argv[1:]])), target)
    out.print(f"wrote {path} (x-moe-stack.tuned records the run)", highlight=False)
    if plot_file is not None:
        out.print(f"wrote {plot(result, plot_file)}", highlight=False)


def parse_duration(text: str) -> float:
    """`20m`, `90s`, `1h`, `1h30m` or plain seconds → seconds."""
    seconds = duration_seconds(text)
    if seconds is None:
        raise SpecError(f"--budget {text!r}: a duration such as 20m, 90s or 1h30m")
    return float(seconds)


def smoke(
    compose_file: Annotated[
        Path, typer.Argument(help="compose file of the stack (started if it isn't running)")
    ] = Path("compose.yaml"),
    profile: Annotated[
        str | None,
        typer.Option("--profile", help="gpu or cpu, for a file emitted with --cpu-image (default: gpu)"),
    ] = None,
    timeout: Annotated[
        int, typer.Option("--timeout", help="seconds the stack may take to become healthy")
    ] = 1800,
    as_json: Annotated[bool, typer.Option("--json", help="the checks as JSON")] = False,
) -> None:
    """Check a stack does what its file says: healthy, its served name, a completion, a chat, a tool call,
    the command it runs, its threads/cpuset/NUMA policy and GPU from inside, metrics. Exit 1 on a failure."""
    checks = run_smoke(compose_file, profile, timeout)
    if as_json:
        sys.stdout.write(json.dumps([asdict(check) for check in checks], indent=2) + "\n")
    else:
        table = text_table("check", "", "seen")
        for check in checks:
            table.add_row(
                check.name,
                Text("ok", style="green") if check.passed else Text("FAIL", style="red"),
                check.seen,
            )
        out.print(table)
    if not all(check.passed for check in checks):
        raise typer.Exit(1)


def down(
    compose_file: Annotated[Path, typer.Argument(help="compose file of the stack")] = Path("compose.yaml"),
) -> None:
    """Stop and remove a stack's containers, network and volumes (the file stays)."""
    stack_down(compose_file)
    out.print(f"stopped and removed the stack of {compose_file} (the file stays)")


def demo(
    engine: EngineOpt = "llama.cpp",
    source: Annotated[
        str | None,
        typer.Option(
            "--source", help="engine tree/tarball (default: the PyPI sdist vendoring the pinned engine)"
        ),
    ] = None,
    port: Annotated[int, typer.Option("--port", help="host port (bound to 127.0.0.1)")] = 8080,
    project: Annotated[
        str | None,
        typer.Option("--project", help="compose project (default: moe-stack-demo-<engine>); a second demo"),
    ] = None,
) -> None:
    """Build the CPU image, fetch the demo model, bring the stack up and have it complete a sentence."""
    adapter = get_engine(engine)
    if not adapter.serves_on_cpu or adapter.sdist is None or adapter.sdist_ref is None:
        able = [e.name for e in map(get_engine, engine_names()) if e.serves_on_cpu and e.sdist]
        raise SpecError(
            f"the demo builds its engine from a PyPI sdist and serves on the CPU, which {adapter.name} "
            f"can't: use --engine {' or '.join(able)}"
        )
    check_port_free("127.0.0.1", port)
    sys.stderr.write(
        f"[1/3] building the {adapter.name} avx2 CPU image (first time: 5-20 min; cached after)\n"
    )
    base_image = ensure_base()
    tree = resolve_local(adapter, source or f"pypi:{adapter.sdist}")
    spec = image_spec(
        adapter.name,
        tree=tree,
        ref=adapter.sdist_ref if source is None else "local",
        base=BaseImages(build=base_image, runtime=base_image),
    )
    with build_display("auto") as show:
        image = build_image(spec, tree, show=show)
    sys.stderr.write(f"[2/3] starting the stack for {image} with the demo model\n")
    started = time.monotonic()
    generated_by = " ".join(["moe-stack", *sys.argv[1:]])
    compose_file = start_demo(adapter.name, image, port, generated_by, project)
    sys.stderr.write(f"[3/3] healthy after {time.monotonic() - started:.1f} s; asking for a completion\n")
    answer = complete(port)
    speed = f", {answer.decode_tokens_per_s:.1f} tok/s decode" if answer.decode_tokens_per_s else ""
    out.print(
        Text.from_markup(
            f"\n{escape(DEMO_PROMPT)}[bold]{escape(answer.text.rstrip())}[/bold]\n"
            f"({answer.completion_tokens} tokens{speed})\n"
        ),
        highlight=False,
    )
    out.print(
        f"The stack keeps running on http://127.0.0.1:{port} (OpenAI API under /v1).\n"
        f"Stop it with: moe-stack down {compose_file}",
        highlight=False,
        soft_wrap=True,
    )

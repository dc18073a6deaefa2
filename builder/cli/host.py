"""`moe-stack doctor`: whether this host can run hybrid MoE inference, and what to fix."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.text import Text

from builder.cli.common import (
    out,
    text_table,
)
from builder.docker_client import docker, gpu_passthrough_available
from builder.errors import (
    DockerUnavailable,
    ModelError,
    StackError,
)
from builder.host.probe import probe
from builder.models.facts import ModelFacts
from builder.models.formats import GGUF
from builder.models.gguf_facts import read_facts
from builder.models.hub import size_problems
from builder.models.kt_weights import read_checkpoint
from builder.platform.local_cuda import local_cuda_images
from builder.running.bandwidth import ARRAY_MIB, TOOL, ReadBandwidth, parse_bandwidth
from builder.running.run import run_in_image
from builder.stacks.doctor import as_dicts, bandwidth_finding, diagnose


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
    bandwidth: Annotated[
        str | None,
        typer.Option(
            "--bandwidth",
            metavar="IMAGE",
            help="also measure this host's memory read rate with moe-stack-bandwidth in IMAGE (an engine "
            "image built for this CPU), and with --model GGUF the decode ceiling it sets",
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
    if bandwidth is not None:
        findings.append(bandwidth_finding(bandwidth, _read_rate(bandwidth), _facts(gguf)))
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


def _read_rate(image: str) -> ReadBandwidth | str:
    """moe-stack-bandwidth's figures in a container of `image`, or why there are none."""
    try:
        printed = run_in_image(image, [TOOL, str(ARRAY_MIB)])
    except StackError as err:
        return str(err)
    return parse_bandwidth(printed) or f"{TOOL} printed no read rate: {printed.strip()[-120:]!r}"


def _facts(gguf: Path | None) -> ModelFacts | None:
    """The model's facts for the decode ceiling; None without a GGUF or one whose header can't be read
    here (the model finding above already says what is wrong with its files)."""
    try:
        return read_facts(GGUF.check(gguf)) if gguf else None
    except ModelError:
        return None

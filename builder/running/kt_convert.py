"""kt-kernel's AMX weights made from a Hugging Face checkpoint: kt-kernel's own converter
(kt-kernel/scripts/convert_cpu_weights.py, which no kt-kernel wheel or sdist ships: it comes from a
ktransformers source tree the user gives) run in the KTransformers image, on this AMX host, into a
staging directory beside the model that is checked, recorded and renamed into place.

The converter quantizes each MoE layer through kt-kernel's AMX kernels (KTMoEWrapper with cpu_save),
so it runs on an AMX CPU only, and it splits every expert over the CPU thread pools the server will
run (`--threadpool-count` = the stack's `--kt-threadpool-count`: one per NUMA node). It stages each
layer in /dev/shm, which Docker caps at 64 MiB unless told: the run's cap is computed from one layer's
quantized size (a cap, not an allocation). FP8 checkpoints are dequantized on the GPU (its Triton kernel).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

from builder.container_start import start_container
from builder.contract import IMAGE_UID
from builder.engines.ktransformers import AMX_FLAGS, VENV
from builder.errors import ModelError, SourceError, StackError
from builder.fd_files import RefusedEntry, open_dir, take_back
from builder.files import user_path, write_file_atomically
from builder.host.probe import HostFacts, missing_flags
from builder.models.kt_weights import RECORD, Checkpoint, ConvertedWeights, read_converted
from builder.models.planner import size
from builder.running.tool_bench import last_error
from builder.stackfile.host_checks import check_readable_in_container

CONVERTER = "kt-kernel/scripts/convert_cpu_weights.py"
QUANT_METHODS = {"AMXINT4": "int4", "AMXINT8": "int8"}  # the converter's --quant-method for each
MODEL_MOUNT, CONVERTER_MOUNT, OUTPUT_MOUNT = "/model", "/converter", "/out"
_GIB = 1024**3


def converter_script(source: Path) -> Path:
    """The converter in a ktransformers tree; SourceError when the tree has none."""
    script = user_path(source).resolve() / CONVERTER
    if not script.is_file():
        raise SourceError(
            f"{source} has no {CONVERTER}: give a ktransformers checkout (git clone "
            "https://github.com/kvcache-ai/ktransformers); the PyPI kt-kernel ships no converter"
        )
    return script


def source_version(source: Path) -> str | None:
    """The tree's version (version.py's __version__), for the record."""
    try:
        text = (source / "version.py").read_text()
    except OSError:
        return None
    match = re.search(r"""__version__\s*=\s*["']([^"']+)["']""", text)
    return match.group(1) if match else None


def default_output(checkpoint: Path, method: str) -> Path:
    """Beside the checkpoint: `Qwen3-235B-A22B` → `Qwen3-235B-A22B-AMXINT4`."""
    return checkpoint.parent / f"{checkpoint.name}-{method}"


@dataclass(frozen=True)
class Conversion:
    """One conversion, planned: what is read, what runs, what is written."""

    checkpoint: Checkpoint
    source: Path  # the ktransformers tree the converter comes from
    script: Path
    output: Path
    method: str
    numa_pools: int
    threads: int
    image: str

    def converter_args(self, model: str, output: str, script: str) -> list[str]:
        """The converter's command line for the checkpoint at `model`, writing to `output`."""
        return [
            script,
            "--input-path",
            model,
            "--input-type",
            self.checkpoint.input_type,
            "--output",
            output,
            "--quant-method",
            QUANT_METHODS[self.method],
            "--cpuinfer-threads",
            str(self.threads),
            "--threadpool-count",
            str(self.numa_pools),
        ]

    @property
    def shm_bytes(self) -> int:
        """/dev/shm's cap: twice one layer's quantized experts (their scales, the copy it reads back)
        and 1 GiB."""
        return 2 * self.checkpoint.layer_bytes(self.method) + _GIB

    @property
    def needs_gpu(self) -> bool:
        return self.checkpoint.input_type == "fp8"

    def record(self) -> dict[str, object]:
        return {
            "method": self.method,
            "numa_pools": self.numa_pools,
            "input_type": self.checkpoint.input_type,
            "checkpoint": str(self.checkpoint.path),
            "image": self.image,
            "converter": CONVERTER,
            "converter_version": source_version(self.source),
            "converted_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


def plan_conversion(
    checkpoint: Checkpoint,
    source: Path,
    method: str,
    host: HostFacts,
    image: str,
    output: Path | None = None,
    numa_pools: int | None = None,
    threads: int | None = None,
) -> Conversion:
    """The conversion on `host`, refused in one line where it could not run or would overwrite."""
    lacking = missing_flags(AMX_FLAGS, host.cpu)
    if lacking:
        raise StackError(
            "kt-kernel's converter quantizes through its AMX kernels, and this CPU lacks "
            f"{' '.join(lacking)}: run kt-convert on the AMX Xeon that will serve the model"
        )
    script = converter_script(source)
    target = user_path(output or default_output(checkpoint.path, method)).resolve()
    if target.exists():
        raise ModelError(f"{target} exists; remove it or give another --out")
    if not target.parent.is_dir() or not os.access(target.parent, os.W_OK):
        raise ModelError(f"{target.parent} is not a directory you can write; give another --out")
    needed, free = checkpoint.converted_bytes(method), shutil.disk_usage(target.parent).free
    if needed > free:
        raise ModelError(
            f"{method} weights of {checkpoint.path.name} need about {size(needed)} and {target.parent} has "
            f"{size(free)} free; free some space or give an --out on another disk"
        )
    if checkpoint.input_type == "fp8" and not host.gpus:
        raise StackError(
            f"{checkpoint.path} is FP8: kt-kernel's converter dequantizes it on a GPU (Triton), and this "
            "host has none; convert it on the GPU host, or from the BF16 release"
        )
    return Conversion(
        checkpoint=checkpoint,
        source=user_path(source).resolve(),
        script=script,
        output=target,
        method=method,
        numa_pools=numa_pools or max(1, len(host.nodes)),
        threads=threads or host.cpu.physical_cores,
        image=image,
    )


def _model_volumes(checkpoint: Path) -> list[tuple[Path, str, str]]:
    """The checkpoint at /model, read-only; a Hugging Face snapshot (files linking into blobs/) file by
    file, so the links resolve in the container."""
    files = sorted(path for path in checkpoint.iterdir() if path.is_file())
    if any(path.is_symlink() and path.resolve().parent != checkpoint.resolve() for path in files):
        return [(path.resolve(), f"{MODEL_MOUNT}/{path.name}", "ro") for path in files]
    return [(checkpoint.resolve(), MODEL_MOUNT, "ro")]


def run_conversion(plan: Conversion, client: DockerClient, say: Callable[[str], None]) -> ConvertedWeights:
    """Run the converter in `plan.image`, check what it wrote and rename it to `plan.output`."""
    staging = Path(tempfile.mkdtemp(prefix=f".{plan.output.name}.", dir=plan.output.parent))
    # As the invoking user, whose files these become; root hands the run to the image's user instead.
    uid, gid = (os.getuid(), os.getgid()) if os.getuid() else (IMAGE_UID, IMAGE_UID)
    if not os.getuid():
        for path in [*plan.checkpoint.path.iterdir(), plan.script]:
            check_readable_in_container(path)
    printed: list[str] = []

    def convert() -> None:
        printed.clear()  # a start tried again prints anew
        script = f"{CONVERTER_MOUNT}/{plan.script.name}"
        lines = client.container.run(
            plan.image,
            plan.converter_args(MODEL_MOUNT, OUTPUT_MOUNT, script),
            entrypoint=f"{VENV}/bin/python",
            remove=True,
            user=f"{uid}:{gid}",
            volumes=[
                *_model_volumes(plan.checkpoint.path),
                (plan.script.parent, CONVERTER_MOUNT, "ro"),
                (staging, OUTPUT_MOUNT, "rw"),
            ],
            shm_size=str(plan.shm_bytes),
            # kt-kernel's AMX variant whatever the image pins (the converter needs its kernels); no HOME
            # in the image for this user: Triton's cache goes to /tmp.
            envs={"KT_KERNEL_CPU_VARIANT": "amx", "HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1"},
            gpus="all" if plan.needs_gpu else None,
            networks=["none"],
            cap_drop=["ALL"],
            security_options=["no-new-privileges"],
            stream=True,
        )
        for _source, raw in lines:  # stream=True: (stdout or stderr, one line)
            line = raw.decode(errors="replace").rstrip()
            printed.append(line)
            say(line)

    try:
        if not os.getuid():
            os.chown(staging, IMAGE_UID, IMAGE_UID)
        start_container(convert, f"kt-kernel's converter in {plan.image}", say)
        return finish_conversion(staging, plan, printed)
    except DockerException as err:
        said = last_error("\n".join([*printed, err.stderr or ""]))
        raise ModelError(f"kt-kernel's converter failed in {plan.image}: {said}") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def finish_conversion(staging: Path, plan: Conversion, printed: list[str]) -> ConvertedWeights:
    """What the converter wrote into `staging`, taken back (see `take_back_output`), checked to be every
    MoE layer for the planned pools (it exits 0 on 'No MoE expert layers found in input!'), recorded,
    and renamed to `plan.output`."""
    take_back_output(staging)
    try:
        weights = read_converted(staging)
    except ModelError:
        said = next((line for line in reversed(printed) if line.strip()), "no output")
        raise ModelError(f"kt-kernel's converter wrote no converted experts ({said})") from None
    if weights.moe_layers != plan.checkpoint.moe_layers or weights.numa_pools != plan.numa_pools:
        raise ModelError(
            f"kt-kernel's converter wrote {weights.moe_layers} MoE layers for {weights.numa_pools} pool(s); "
            f"the checkpoint has {plan.checkpoint.moe_layers} and {plan.numa_pools} were asked for"
        )
    record = plan.record()
    write_file_atomically(staging / RECORD, json.dumps(record, indent=2) + "\n", no_follow=True)
    staging.rename(plan.output)
    return ConvertedWeights(plan.output, weights.numa_pools, weights.moe_layers, plan.method, record)


def take_back_output(staging: Path) -> None:
    """The converter's output made the invoking user's (files 0644, directories 0755), never following
    what the container left: it ran as another user (the image's, for root) and may have left links,
    hard links, devices or world-writable files for root to write, read or chown through."""
    try:
        with open_dir(staging) as top:
            take_back(top, os.getuid(), os.getgid())
    except RefusedEntry as err:
        raise ModelError(
            f"kt-kernel's converter left {err.name!r} in its output, {err.kind}; moe-stack takes plain files "
            "and directories only, so it removed that and kept nothing: check the converter in --source"
        ) from None
    except OSError as err:
        raise ModelError(
            f"can't take back kt-kernel's converter's output in {staging} ({err.strerror or err}); "
            "nothing was kept"
        ) from None

"""KTransformers: kt-kernel's CPU MoE kernels behind an SGLang server (current), and the 0.2.4
server the seed pins (legacy). Both are Python engines: a venv is built in one stage and copied
into the runtime image, and the stack runs `python -m <server module>` through a small wrapper."""

from __future__ import annotations

import re
import shlex
from abc import abstractmethod
from pathlib import Path

from builder.contract import CONFIG_DIR, ENGINE_BIN_DIR, MODEL_DIR, SERVER_MODULE_ENV
from builder.engines.base import CUDA_STUB_DIR, CUDA_STUB_SETUP, LISTEN, Engine, ImageSpec, StackSpec
from builder.engines.kt_wheels import LOCK_FILE, check_wheelhouse, read_lock
from builder.engines.sglang_hicache import FLAGS as HICACHE_FLAGS
from builder.engines.sglang_hicache import STORE as HICACHE_STORE
from builder.engines.sglang_hicache import hicache_args
from builder.errors import SpecError, StackError
from builder.host.probe import CpuInfo, missing_flags
from builder.models.formats import KT_WEIGHTS, ModelFormat
from builder.models.kt_weights import read_converted
from builder.models.kv_cache import CacheLayout
from builder.platform.clone import clone_commands
from builder.platform.flags import check_choice, flag_args, has_flag
from builder.platform.toolchain import Toolchain, cuda_release, toolchain
from builder.spec import BaseImages, CpuTarget, CudaTarget, EngineSource, LocalSource, PypiSource

# kt-kernel 0.7.2's backends that read GGUF, and those that run on AMX (see StackSpec.kt_method).
GGUF_KT_METHODS = frozenset({"LLAMAFILE"})
AMX_KT_METHODS = frozenset({"AMXINT4", "AMXINT8"})
AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
VENV = "/opt/venv"
SERVER_WRAPPER = f"{ENGINE_BIN_DIR}/moe-stack-server"
KT_CHECK = "/usr/local/bin/moe-stack-kt-check"
PYTORCH_INDEX = "https://download.pytorch.org/whl"

# kt-kernel's CPU variants, best first, and the /proc/cpuinfo flags each needs: the same rule its
# loader applies (kt_kernel/_cpu_detect.py in 0.7.2); KT_KERNEL_CPU_VARIANT overrides it.
_AVX512_BASE = frozenset({"avx512f", "avx512bw"})
_AVX512_VNNI = _AVX512_BASE | {"avx512_vnni"}
_AVX512_VBMI = _AVX512_VNNI | {"avx512_vbmi"}
_AVX512_BF16 = _AVX512_VBMI | {"avx512_bf16"}
KT_VARIANTS: tuple[tuple[str, frozenset[str]], ...] = (
    ("amx", _AVX512_BF16 | frozenset(AMX_FLAGS)),
    ("avx512_bf16", _AVX512_BF16),
    ("avx512_vbmi", _AVX512_VBMI),
    ("avx512_vnni", _AVX512_VNNI),
    ("avx512_base", _AVX512_BASE),
    ("avx2", frozenset({"avx2"})),
)

# What kt-kernel's loader (and so a CPU-only kernel image) imports beside the kernel itself.
KT_KERNEL_IMPORTS = ("torch", "numpy", "gguf", "safetensors")


def kt_variant(flags: frozenset[str] | set[str]) -> str:
    """The kt-kernel variant its loader picks on a CPU with `flags` (spelled with or without '_')."""
    spelled = set(flags) | {flag.replace("_", "") for flag in flags}
    for name, needs in KT_VARIANTS:
        if all(flag in spelled or flag.replace("_", "") in spelled for flag in needs):
            return name
    return "avx2"


def torch_index(cuda: CudaTarget, pypi_cuda: str) -> str | None:
    """PyTorch's wheel index for this CUDA release or its CPU builds; None where PyPI's own x86-64
    torch (a build for `pypi_cuda`) is already the right one."""
    if cuda.version == pypi_cuda:
        return None
    tag = "cpu" if cuda.version is None else "cu" + cuda.version.replace(".", "")
    return f"{PYTORCH_INDEX}/{tag}"


def torch_arch_list(cuda: CudaTarget) -> str:
    """TORCH_CUDA_ARCH_LIST for the GPU archs: 86 → 8.6, 120 → 12.0."""
    return ";".join(f"{arch // 10}.{arch % 10}" for arch in cuda.archs)


def _cpu_instruct(cpu: CpuTarget) -> str:
    """The CPU_INSTRUCT/CPUINFER_CPU_INSTRUCT value for a target, never NATIVE (it means the build
    host's CPU: the "Illegal instruction" of the official 0.2.x images). AVX512 is the baseline
    AVX-512 set every AVX-512 target has; FANCY's exact set is not checked against Zen 4 here."""
    return "AVX512" if "avx512f" in cpu.required_flags else "AVX2"


# kt-kernel publishes CPython 3.11 and 3.12 wheels only (manylinux_2_35). Images that install released
# wheels (CPU-only and CUDA alike) run on Debian bookworm (Python 3.11; trixie has 3.13): their CUDA is
# torch's own (the nvidia-*-cu12 wheels it depends on), so they need no CUDA base and no registry
# (`moe-stack base --suite bookworm` makes one). Only a build from source compiles CUDA code: it needs
# nvcc, on NVIDIA's Ubuntu 24.04 devel image (Python 3.12).
PYTHON_CPU_BASE = "debian:bookworm-slim"
_PYTHON_OS = ("ubuntu24.04",)
# The torch kt-kernel 0.7.2 and sglang-kt pin, and its CUDA 12 builds on PyTorch's index (cu126, cu128;
# its cu130 build can't load sgl_kernel).
PINNED_TORCH = "2.9.1"
TORCH_CUDA_BUILDS = ("12.6", "12.8")


def _python_toolchain(cpu: CpuTarget, cuda: CudaTarget, base: BaseImages, compiles: bool) -> Toolchain:
    """The toolchain of a Python engine (KTransformers): a venv built on the OS it runs on, with
    compilers only when it `compiles` from source (then the CPU target's GCC rules apply too)."""
    if base.cuda != "nvidia":
        raise SpecError(
            f"KTransformers images take their CUDA from torch's wheels, not from a CUDA base: drop "
            f"--cuda-base {base.cuda} (its released wheels install on Debian bookworm, no registry needed)"
        )
    if compiles and cuda.version is not None and cuda_release(cuda).ubuntu not in _PYTHON_OS:
        raise SpecError(
            f"CUDA {cuda.version} images are {cuda_release(cuda).ubuntu}, whose Python has no "
            "kt-kernel wheels (CPython 3.11/3.12 only): use CUDA 12.6 or newer"
        )
    native = toolchain(cpu, cuda, base) if compiles else None
    if cuda.version is None or not compiles:
        build_image = runtime_image = PYTHON_CPU_BASE
    else:
        release = cuda_release(cuda)
        runtime_image = release.image("runtime")
        build_image = release.image("devel")
    python = ("ca-certificates", "python3", "python3-venv")
    build_packages = (
        python
        if native is None
        else (
            *python,
            "python3-dev",
            "build-essential",
            "cmake",
            "git",
            "ninja-build",
            "pkg-config",
            "libnuma-dev",
            "libhwloc-dev",
            *(f"{tool}-{native.gcc_major}" for tool in ("gcc", "g++") if native.gcc_major),
        )
    )
    return Toolchain(
        build_image=base.build or build_image,
        runtime_image=base.runtime or runtime_image,
        gcc_major=native.gcc_major if native else None,
        build_packages=build_packages,
        runtime_packages=(
            "python3",
            "libgomp1",
            "numactl",
            "libnuma1",
            "libhwloc15",
            # Triton (under SGLang) compiles its CUDA launcher stub with the system C
            # compiler and Python's headers at first use.
            *(("gcc", "libc6-dev", "python3-dev") if cuda.version is not None else ()),
        ),
    )


class _PythonEngine(Engine):
    """What both KTransformers adapters share: the Python template, venv, wrapper and checks."""

    template = "ktransformers/Dockerfile.j2"
    takes_override_rules = False
    # Without SYS_NICE its hwloc membind prints "Operation not permitted" and runs unbound (seen in
    # this repo's kernel image: tests/integration/test_ktransformers.py).
    binds_numa_memory = True
    serves_on_cpu = False
    needs_config_dir = True
    server_module: str
    package_dir: str  # the directory of the source tree that pip builds
    pypi_torch_cuda: str  # the CUDA release PyPI's x86-64 build of the torch it pins is for
    health_path = "/health"  # what answers 200 once the model is loaded
    # Not measured, estimated: an install of wheels (torch, SGLang: several GB, no compile) at 20 minutes.
    compile_minutes_cpu = 20.0
    cuda_compile_factor = 0.0
    carries_sgl_kernel = False  # SGLang's CUDA kernels, placed and checked per arch at build time

    def extra_index(self, cuda: CudaTarget) -> str:
        """pip's option for PyTorch's index, where this CUDA target needs it."""
        index = torch_index(cuda, self.pypi_torch_cuda)
        return f" --extra-index-url {index}" if index else ""

    def _mode(self, spec: ImageSpec) -> str:
        """pypi (released wheels), wheels (a local wheelhouse) or source (built from a tree)."""
        if isinstance(spec.source, PypiSource):
            return "pypi"
        if isinstance(spec.source, LocalSource) and spec.source.holds == "wheels":
            return "wheels"
        return "source"

    def toolchain(self, spec: ImageSpec) -> Toolchain:
        return _python_toolchain(spec.cpu, spec.cuda, spec.base, compiles=self._mode(spec) == "source")

    def cuda_origin(self, spec: ImageSpec) -> str:
        """Released wheels bring their CUDA (torch's nvidia-*-cu12 wheels); a source build NVIDIA's."""
        return "nvidia" if self._mode(spec) == "source" else "torch-wheels"

    def source_context(self, holds: str) -> str:
        return "wheelhouse" if holds == "wheels" else super().source_context(holds)

    def server_path(self, spec: ImageSpec) -> str | None:
        return SERVER_WRAPPER if spec.cuda.version is not None else None

    def template_values(self, spec: ImageSpec, tools: Toolchain) -> dict[str, object]:
        mode = self._mode(spec)
        has_server = spec.cuda.version is not None
        # A source build's server runs on the devel image, whose CUDA stub stands in for the driver.
        needs_stub = has_server and mode == "source"
        return {
            "mode": mode,
            "venv": VENV,
            "clone_commands": [
                *clone_commands(self.source_url(spec), spec.ref),
                "git -C /src submodule update --quiet --init --recursive --depth 1",
            ],
            "fetch_requirements": self.fetch_requirements(spec),
            "build_env": [
                f"{key}={shlex.quote(value)}" for key, value in self.build_env(spec, tools).items()
            ],
            "package_dir": self.package_dir,
            "prebuild_install": self.prebuild_install(spec),
            "install_commands": self.install_commands(spec, mode),
            "install_lock": LOCK_FILE if self.installs_lock(spec) else None,
            "server_module": self.server_module if has_server else None,
            "server_dir": str(Path(SERVER_WRAPPER).parent),
            "help_setup": list(CUDA_STUB_SETUP) if needs_stub else [],
            # The wrapper as the runtime runs it: the venv's Python first on PATH, the module named.
            "help_command": f"{f'LD_LIBRARY_PATH={CUDA_STUB_DIR} ' if needs_stub else ''}"
            f"PATH={VENV}/bin:$PATH "
            f"{SERVER_MODULE_ENV}={self.server_module} {SERVER_WRAPPER} --help",
            "engine_bin": SERVER_WRAPPER if has_server else KT_CHECK,
            "engine_env": self.engine_env(spec),
            "health_path": self.health_path,
            "gpu_libs_archs": ",".join(map(str, spec.cuda.archs))
            if has_server and self.carries_sgl_kernel
            else "",
            "keeps_prompts": has_server and self.prompt_store is not None,
        }

    def context_files(self, root: Path, spec: ImageSpec) -> dict[str, str]:
        names = [
            "moe-stack-kt-check",
            "moe-stack-server",
            "moe-stack-kt-gpu-libs",
            "moe-stack-sglang-with-key",
        ]
        if self.prompt_store is not None:
            names += ["moe-stack-prompts", "moe-stack-switch-interval.pth"]
        if self.installs_lock(spec):
            names.append(LOCK_FILE)
        return {name: (root / "ktransformers" / name).read_text() for name in names}

    def installs_lock(self, spec: ImageSpec) -> bool:
        """Whether the image installs exactly the wheels of the hash lock (kt_wheels.py)."""
        return False

    def check_local_source(self, spec: ImageSpec, tree: Path | None) -> None:
        if tree is not None and self.installs_lock(spec):
            check_wheelhouse(tree, read_lock())

    def fetch_requirements(self, spec: ImageSpec) -> list[str]:
        return []

    def prebuild_install(self, spec: ImageSpec) -> list[str]:
        return []

    def engine_env(self, spec: ImageSpec) -> dict[str, str]:
        return {}

    def build_env(self, spec: ImageSpec, tools: Toolchain) -> dict[str, str]:
        env: dict[str, str] = {}
        if tools.gcc_major:
            env.update(CC=f"gcc-{tools.gcc_major}", CXX=f"g++-{tools.gcc_major}")
        return env

    @abstractmethod
    def install_commands(self, spec: ImageSpec, mode: str) -> list[str]:
        """The pip commands that fill the venv, with the wheelhouse mounted at /wheelhouse."""

    # -- run ----------------------------------------------------------------------------------
    def _refuse_unsupported(self, stack: StackSpec) -> None:
        """What its server can't do without: a GPU, the model's Hugging Face directory."""
        if stack.gpu == "none":
            raise StackError(
                f"{self.name} serves through a GPU (attention and KV cache on it, experts on the CPU) "
                "and has no CPU-only server: give --gpu nvidia (or cdi) and a CUDA image, or use "
                "llama.cpp/ik_llama.cpp for a CPU-only stack"
            )
        if stack.config_dir is None:
            what = (
                "checkpoint (config.json, tokenizer, *.safetensors)"
                if self.config_dir_weights
                else "directory"
            )
            raise StackError(
                f"{self.name} reads the model from its Hugging Face {what}: give --config-dir DIR"
            )


# SGLang's loader and memory pool on the GPU (sglang-kt 0.7.2, seen on the H200: bench/results/kt-*):
# `Load weight end. ... mem usage=0.38 GB.` and `KV Cache is allocated. #tokens: 32978591, ...`.
_SGLANG_WEIGHTS = re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB")
_SGLANG_KV = re.compile(r"KV Cache is allocated\. #tokens: (\d+)")


_PER_REQUEST = (
    'SGLang takes thinking per request: a request\'s chat_template_kwargs {"enable_thinking": false} or its '
    "reasoning_effort"
)


class KTransformers(_PythonEngine):
    name = "ktransformers"
    slug = "ktransformers"
    upstream_url = "https://github.com/kvcache-ai/ktransformers.git"
    server_label = "SGLang server with kt-kernel CPU experts"
    source_hint = (
        "a wheelhouse (a directory with kt_kernel-*.whl) or a ktransformers checkout with submodules"
    )
    server_module = "sglang.launch_server"
    package_dir = "kt-kernel"
    installs_wheels = True
    runtime_dispatch = True  # kt-kernel loads one of its _kt_kernel_ext_* variants at run time
    metrics_flag = "--enable-metrics"
    # SGLang renders chat with the model's own template (its tokenizer_config.json) and returns tool
    # calls as tool_calls only with a parser.
    tool_calls_flag = "--tool-call-parser"
    # sglang-kt 0.7.2's sglang/srt/entrypoints/http_server.py routes /v1/chat/completions, /v1/responses,
    # /v1/messages (anthropic_v1_messages) and /v1/messages/count_tokens (anthropic_v1_count_tokens).
    apis = ("openai-chat", "openai-responses", "anthropic-messages", "anthropic-count-tokens")
    # It places experts itself (attention and KV cache on the GPU, routed experts on the CPU): no -ot
    # rules, layer counts, cache types or llama.cpp's load and sampling switches.
    honours = frozenset({
        "ctx_size", "cpu_threads", "parallel", "served_name", "metrics", "api_key_file", "kt_method",
        "reasoning_parser", "tool_call_parser", "gpu_experts", "config_dir", "trust_remote_code",
        "extra_args"
    })  # fmt: skip
    # SGLang switches thinking and its effort per request (a request's chat_template_kwargs
    # {"enable_thinking": false}, its reasoning_effort), with no server flag for either (sglang-kt 0.7.2's
    # --help, dockerfiles/contracts/ktransformers.json); its --reasoning-parser splits out the thoughts.
    unread_reasons = (
        *((name, _PER_REQUEST) for name in ("thinking", "reasoning_budget", "reasoning_effort")),
        ("reasoning_format", "its --reasoning-parser puts a reply's thoughts in reasoning_content"),
        ("mmproj", "its stacks here serve text models; images need a llama.cpp engine"),
    )
    flag_spellings = tuple(
        frozenset({flag})
        for flag in (
            "--model-path",
            "--kt-weight-path",
            "--kt-method",
            "--kt-cpuinfer",
            "--kt-threadpool-count",
            "--kt-numa-nodes",
            "--kt-num-gpu-experts",
            "--context-length",
            "--max-running-requests",
            "--max-total-tokens",
            "--trust-remote-code",
            "--host",
            "--port",
            "--served-model-name",
            "--enable-metrics",
            "--reasoning-parser",
            "--tool-call-parser",
            *(flag for flag, _ in HICACHE_FLAGS),
        )
    )
    # --keep-prompts: SGLang's hierarchical cache with its file backend (engines/sglang_hicache.py).
    prompt_store = HICACHE_STORE
    model_flags = ("--model-path", "--kt-weight-path")
    model_format: ModelFormat = KT_WEIGHTS  # a GGUF (LLAMAFILE) or kt-kernel's converted directory (AMX)
    carries_sgl_kernel = True
    # SGLang takes the key only as `--api-key VALUE`: the image's launcher reads the stack's secret file
    # (dockerfiles/ktransformers/moe-stack-sglang-with-key), so the key is on no command line.
    key_file_from_env = True
    # SGLang loads attention, embeddings, norms and router from --model-path ("Cannot find any model
    # weights" without them); kt-kernel only the routed experts from --kt-weight-path.
    config_dir_weights = True
    pypi_torch_cuda = "12.8"  # kt-kernel 0.7.2 and sglang-kt pin torch 2.9.1: PyPI's is the CUDA 12.8 build

    def cache_layout(self, mla: int | None, swa_full: bool = False) -> CacheLayout:
        """SGLang serves DeepSeek with MLA: its cache holds the latent (the rest counted as the base does)."""
        return CacheLayout(latent=True)

    def gpu_use(self, log: str) -> tuple[bool | None, str]:
        weights, kv = _SGLANG_WEIGHTS.findall(log), _SGLANG_KV.findall(log)
        if not weights or not kv:
            return None, "SGLang's log shows no weights loaded and no KV cache allocated yet"
        return True, f"weights {float(weights[-1]):.2f} GB on the GPU, KV cache of {int(kv[-1])} tokens"

    def check_image(self, spec: ImageSpec) -> None:
        """sgl_kernel 0.3.21.post2's CUDA libraries link CUDA 12's (libcudart.so.12, libcublas.so.12:
        readelf of the wheels' common_ops): a CUDA 13 venv has neither, so its server could not start."""
        super().check_image(spec)
        if spec.cuda.version is not None and not spec.cuda.version.startswith("12."):
            raise SpecError(
                f"{self.name} {spec.ref}'s SGLang kernels (sgl_kernel) link CUDA 12 (libcudart.so.12, "
                f"libcublas.so.12), which a CUDA {spec.cuda.version} image lacks: build it with --cuda 12.8"
            )
        if spec.cuda.version is not None and spec.cuda.version not in TORCH_CUDA_BUILDS:
            raise SpecError(
                f"{self.name} {spec.ref} pins torch {PINNED_TORCH}, which PyTorch builds for CUDA "
                f"{', '.join(TORCH_CUDA_BUILDS)} only (12.x): build it with --cuda 12.8"
            )

    def default_source(self, ref: str | None) -> EngineSource:
        return PypiSource(ref=ref or self.default_ref)

    def is_source_tree(self, path: Path) -> bool:
        return (path / "kt-kernel/CMakeLists.txt").is_file()

    def holds_wheels(self, path: Path) -> bool:
        return any(path.glob("kt_kernel-*.whl"))

    def required_flags(self, cuda: CudaTarget) -> frozenset[str]:
        if cuda.version is None:  # the CPU-only image is kt-kernel and its check, no server
            return frozenset()
        return frozenset({"--model-path", "--host", "--port", "--kt-weight-path", "--kt-cpuinfer"})

    def _requirement(self, spec: ImageSpec, pinned: bool) -> str:
        """kt-kernel alone for a CPU kernel image; with a server the documented `ktransformers[sglang]`:
        its meta wheel alone carries sgl_kernel's Hopper library, and it and four of its dependencies
        one part each of the library every other GPU loads (KT-ON-THE-GPU: without it `import
        sgl_kernel` fails on sm_90 and sm_120). Quoted: the brackets would be a shell glob."""
        name = "kt-kernel" if spec.cuda.version is None else "ktransformers[sglang]"
        return shlex.quote(f"{name}=={spec.ref}" if pinned else name)

    def fetch_requirements(self, spec: ImageSpec) -> list[str]:
        """What the wheelhouse stage downloads (no dependencies: the install resolves those)."""
        names = ["kt-kernel"] + (["sglang-kt", "ktransformers"] if spec.cuda.version is not None else [])
        return [f"{name}=={spec.ref}" for name in names]

    def build_env(self, spec: ImageSpec, tools: Toolchain) -> dict[str, str]:
        env = super().build_env(spec, tools)
        if spec.cpu.runtime_dispatch:  # every variant, chosen at load like the released wheels
            env["CPUINFER_BUILD_ALL_VARIANTS"] = "1"
        else:
            env["CPUINFER_CPU_INSTRUCT"] = _cpu_instruct(spec.cpu)
            env["CPUINFER_ENABLE_AMX"] = "ON" if "amx_tile" in spec.cpu.required_flags else "OFF"
        return env

    def installs_lock(self, spec: ImageSpec) -> bool:
        return self._mode(spec) == "wheels" and spec.cuda.version is None

    def install_commands(self, spec: ImageSpec, mode: str) -> list[str]:
        pip = f"{VENV}/bin/pip install --no-cache-dir"
        if self.installs_lock(spec):
            # A CPU kernel image from a local wheelhouse: PyPI's torch is a CUDA build and a CPU torch
            # of kt-kernel's pinned version may not be at hand offline, so a CPU torch serves. Exactly
            # the lock's wheels (kt-kernel, that torch, the modules its loader imports and all they
            # need), each held to its sha256; without dependencies, since kt-kernel's own pins torch.
            return [
                f"{pip} --no-index --find-links /wheelhouse --no-deps --require-hashes -r /tmp/{LOCK_FILE}"
            ]
        if mode == "wheels":
            return [f"{pip} --no-index --find-links /wheelhouse {self._requirement(spec, pinned=False)}"]
        # Released or source-built kt-kernel with its pinned torch, from PyTorch's index for this CUDA.
        return [
            (
                f"{pip} --find-links /wheelhouse{self.extra_index(spec.cuda)} "
                f"{self._requirement(spec, pinned=mode == 'pypi')}"
            )
        ]

    def engine_env(self, spec: ImageSpec) -> dict[str, str]:
        """A named CPU target pins its kt-kernel variant (the image's ISA guard already refuses a CPU
        without it); `portable` leaves the choice to kt-kernel's loader. SGLang reads the checkpoint's
        own config: sglang-kt 0.7.2's default SGLANG_APPLY_CONFIG_BACKUP=auto replaces any DeepSeek
        checkpoint's config.json with a DeepSeek-V4 config it ships (its hf_transformers_utils.py), so
        an R1 stack built that model instead (on the H200: bench/results/kt-seed-models-2026-12-02)."""
        env = {"SGLANG_APPLY_CONFIG_BACKUP": "none"}
        if spec.cuda.version is not None and self._mode(spec) != "source":
            # What NVIDIA's images set for its container toolkit, which this image's Debian base lacks:
            # without `compute` no libcuda.so.1 is mounted; an older driver is refused at start.
            env |= {
                "NVIDIA_VISIBLE_DEVICES": "all",
                "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
                "NVIDIA_REQUIRE_CUDA": f"cuda>={spec.cuda.version}",
            }
        if spec.cpu.runtime_dispatch:
            return env
        return {**env, "KT_KERNEL_CPU_VARIANT": kt_variant(frozenset(spec.cpu.required_flags))}

    def check_host(self, stack: StackSpec, cpu: CpuInfo) -> None:
        """An AMX expert backend on a CPU without AMX would fail only when the model loads: say it now."""
        method = self.kt_method(stack)
        if method in AMX_KT_METHODS:
            lacking = missing_flags(AMX_FLAGS, cpu)
            if lacking:
                raise StackError(
                    f"--kt-method {method} runs on AMX, and this CPU lacks {' '.join(lacking)}: "
                    "use --kt-method LLAMAFILE (GGUF weights, AVX2/AVX-512), or --for-other-host to emit "
                    "it for an AMX Xeon"
                )

    def check_image_target(self, stack: StackSpec, cpu_target: CpuTarget) -> None:
        """A named target's image pins its kt-kernel variant (engine_env): an AMX backend needs `amx`."""
        method = self.kt_method(stack)
        if method not in AMX_KT_METHODS or cpu_target.runtime_dispatch:
            return
        pinned = kt_variant(frozenset(cpu_target.required_flags))
        if pinned != "amx":
            raise StackError(
                f"image {stack.image_ref} pins kt-kernel's {pinned} variant (CPU target {cpu_target.name}) "
                f"and --kt-method {method} runs on its amx variant: use the portable or sapphirerapids image"
            )

    def kt_method(self, stack: StackSpec) -> str:
        """The expert backend: the one asked for, else what the weights are (a GGUF: LLAMAFILE; kt-kernel's
        converted weights: the method moe-stack recorded converting them with), checked against them."""
        if not stack.model.path.is_dir():
            asked = stack.kt_method or "LLAMAFILE"
            if asked not in GGUF_KT_METHODS:
                made_by = "kt-kernel's converter" if asked in AMX_KT_METHODS else "a safetensors checkpoint"
                raise StackError(
                    f"--kt-method {asked} reads weights from {made_by}, not a GGUF file like "
                    f"{stack.model.name}: use --kt-method LLAMAFILE (the one kt-kernel backend that reads "
                    "GGUF), or give the directory `moe-stack kt-convert` wrote"
                )
            return asked
        weights = read_converted(stack.model.path)
        method = stack.kt_method or weights.method
        if method is None:
            raise StackError(
                f"{stack.model.path} was converted outside moe-stack, so its method is unrecorded: pass "
                "--kt-method AMXINT4 or AMXINT8, as it was converted"
            )
        if method not in AMX_KT_METHODS or (weights.method is not None and method != weights.method):
            raise StackError(
                f"{stack.model.path} holds kt-kernel's converted {weights.method or 'AMX'} experts, which "
                f"--kt-method {method} does not read: drop --kt-method (or give a GGUF for LLAMAFILE)"
            )
        if weights.numa_pools != stack.numa_node_count:
            raise StackError(
                f"{stack.model.path} was converted for {weights.numa_pools} CPU thread pool(s) (NUMA nodes) "
                f"and this stack runs {stack.numa_node_count} (--kt-threadpool-count): kt-kernel would load "
                "the wrong slices; convert again with `moe-stack kt-convert --numa-pools "
                f"{stack.numa_node_count}`, or run on {weights.numa_pools} nodes (--numa-nodes)"
            )
        return method

    def arguments(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """sglang-kt: kt-kernel's expert weights (a GGUF's directory for LLAMAFILE, the converted
        directory for AMXINT4/8), one CPU thread pool per NUMA node with the stack's physical cores,
        attention and KV cache on the GPU from the checkpoint in the config directory."""
        self._refuse_unsupported(stack)
        method = self.kt_method(stack)
        # A GGUF's directory is mounted at /models; a converted directory's parent is (directory_mount).
        weights = f"{MODEL_DIR}/{stack.model.name}" if stack.model.path.is_dir() else MODEL_DIR
        settings = {
            "--model-path": CONFIG_DIR,
            "--kt-weight-path": weights,
            "--kt-method": method,
            "--kt-cpuinfer": str(stack.cpu_threads),
            "--kt-threadpool-count": str(stack.numa_node_count),
            **LISTEN,
            "--context-length": str(stack.ctx_size),
            "--max-running-requests": str(stack.parallel),
            # The KV pool holds the stack's context for each request, as a llama.cpp stack's cache does:
            # SGLang's default fills its static memory fraction (125.8 GB of an H200 for a 16k one-request
            # stack), and on a 2-layer R1 slice that pool asked for 186 GiB and failed
            # (bench/results/kt-seed-models-2026-12-02).
            "--max-total-tokens": str(stack.ctx_size * stack.parallel),
        }
        args = flag_args(settings)
        if stack.bind_nodes:  # one pool per chosen node, in that order (it defaults to nodes 0..count-1)
            args += ["--kt-numa-nodes", *map(str, stack.bind_nodes)]
        # Always written: without it (or a ratio) sglang-kt 0.7.2 configures no kt-kernel experts at
        # all and runs every expert on the GPU from --model-path's checkpoint (kt_ep_wrapper.py's
        # "Either kt_num_gpu_experts or kt_gpu_experts_ratio is required but not set", seen on the H200).
        args += ["--kt-num-gpu-experts", str(stack.gpu_experts or 0)]
        if stack.served_name is not None and has_flag(flags, "--served-model-name"):
            args += ["--served-model-name", stack.served_name]
        if stack.metrics and has_flag(flags, "--enable-metrics"):
            args.append("--enable-metrics")
        if stack.trust_remote_code:
            args.append("--trust-remote-code")
        for flag, value in (
            ("--reasoning-parser", stack.reasoning_parser),
            ("--tool-call-parser", stack.tool_call_parser),
        ):
            if value is not None:  # written even where the contract lacks it: compose then refuses it
                check_choice(flags, flag, value, self.name)
                args += [flag, value]
        if stack.keep_prompts:
            args += hicache_args(self.loaded_model(stack.model, stack.mtp), flags, self.name)
        return args


class KTransformersLegacy(_PythonEngine):
    name = "ktransformers-legacy"
    slug = "ktransformers-legacy"
    upstream_url = "https://github.com/kvcache-ai/ktransformers.git"
    server_label = "0.2.x server (ktransformers.server.main)"
    source_hint = "a ktransformers v0.2.x checkout with submodules (0.2.4 is on neither PyPI nor this host)"
    server_module = "ktransformers.server.main"
    package_dir = "."
    cuda_only = True  # its build compiles CUDA kernels
    cuda_compile_factor = 2.0  # its source build's CUDA kernels: twice mainline's (estimated, not measured)
    # 0.2.x places experts by its optimize rules; it has server-side temperature and top-p, no metrics.
    honours = frozenset(
        {"ctx_size", "cpu_threads", "served_name", "temperature", "top_p", "config_dir", "extra_args"}
    )
    flag_spellings = tuple(
        frozenset({flag})
        for flag in (
            "--model_path",
            "--gguf_path",
            "--cpu_infer",
            "--cache_lens",
            "--host",
            "--port",
            "--model_name",
            "--temperature",
            "--top_p",
        )
    )
    model_flags = ("--model_path", "--gguf_path")
    # 0.2.4's server routes OpenAI's chat (ktransformers/server/api/openai/endpoints/chat.py, without tools)
    # and legacy completions, and Ollama's API: no Responses, no Anthropic Messages (the default `apis`).
    # 0.2.4's model classes: DeepseekV2/V3 (GGUF deepseek2), Qwen2-MoE, Llama and Mixtral (GGUF llama);
    # not Qwen3-MoE or Qwen3-Next (its ktransformers/models/ and optimize rules, v0.2.4).
    gguf_architectures = frozenset({"deepseek2", "qwen2moe", "llama"})
    health_path = "/v1/models"  # its OpenAI-compatible model list (0.2.x documents no /health)
    # torch for 0.2.4 with CUDA 12.8: the first torch with cu128 wheels (Blackwell, the seed's RTX 5090);
    # PyPI's 2.7 wheels are CUDA 12.6 builds, so 12.8 comes from PyTorch's index.
    torch_version = "2.7.1"
    pypi_torch_cuda = "12.6"

    def is_source_tree(self, path: Path) -> bool:
        return (path / "ktransformers/server/main.py").is_file() and (path / "setup.py").is_file()

    def required_flags(self, cuda: CudaTarget) -> frozenset[str]:
        return frozenset({"--gguf_path", "--model_path", "--port", "--cpu_infer"})

    def prebuild_install(self, spec: ImageSpec) -> list[str]:
        """Its setup.py imports torch and builds against it, so torch (for this CUDA) comes first."""
        return [
            f"{VENV}/bin/pip install --no-cache-dir{self.extra_index(spec.cuda)} torch=={self.torch_version}",
            f"{VENV}/bin/pip install --no-cache-dir setuptools wheel packaging ninja cpufeature numpy",
        ]

    def build_env(self, spec: ImageSpec, tools: Toolchain) -> dict[str, str]:
        env = super().build_env(spec, tools)
        env.update(
            USE_NUMA="1",
            CPU_INSTRUCT=_cpu_instruct(spec.cpu),
            TORCH_CUDA_ARCH_LIST=torch_arch_list(spec.cuda),
            KTRANSFORMERS_FORCE_BUILD="TRUE",
        )
        return env

    def install_commands(self, spec: ImageSpec, mode: str) -> list[str]:
        return [
            (
                f"{VENV}/bin/pip install --no-cache-dir{self.extra_index(spec.cuda)} "
                f"--find-links /wheelhouse ktransformers torch=={self.torch_version}"
            )
        ]

    def arguments(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """The seed's command: GGUF directory, HF config directory, CPU threads, KV cache length."""
        self._refuse_unsupported(stack)
        settings = {
            "--model_path": CONFIG_DIR,
            "--gguf_path": MODEL_DIR,
            "--cpu_infer": str(stack.cpu_threads),
            "--cache_lens": str(stack.ctx_size),
            **LISTEN,
        }
        args = flag_args(settings)
        if stack.served_name is not None and has_flag(flags, "--model_name"):
            args += ["--model_name", stack.served_name]
        # 0.2.x's server-side sampling defaults (its metrics: none).
        if stack.temperature is not None:
            args += ["--temperature", f"{stack.temperature:g}"]
        if stack.top_p is not None:
            args += ["--top_p", f"{stack.top_p:g}"]
        return args

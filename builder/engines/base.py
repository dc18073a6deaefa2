"""What every llama.cpp-family engine adapter provides: build recipe values and server flags."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from builder.spec import CpuTarget, CudaTarget, StackSpec
from builder.targets import GGML_X86_FEATURES

# Port the engine listens on inside the container; the stack maps a host port onto it.
CONTAINER_PORT = 8080
MODEL_DIR = "/models"
# All routed experts in CPU RAM (the seed's rule): the gate/up/down expert tensors of every layer.
EXPERTS_ON_CPU_RULE = r"blk\.[0-9]+\.ffn_.*_exps\.weight=CPU"


class Engine(ABC):
    """An inference engine built with cmake into a single `llama-server`-style binary."""

    name: str  # spec name, e.g. "llama.cpp"
    slug: str  # image repository name, e.g. "llama-cpp"
    upstream_url: str
    default_ref: str
    sdist: str  # a PyPI sdist that vendors this engine (for hosts without GitHub access)
    sdist_subdir: str  # the engine tree inside that sdist
    sdist_ref: str  # the ref an image built from that sdist is tagged with
    server_target: str = "llama-server"
    needs_build_info_shim: bool = False

    # -- source -------------------------------------------------------------------------------
    @abstractmethod
    def is_source_tree(self, path: Path) -> bool:
        """Whether `path` is the root of this engine's source tree."""

    # -- build --------------------------------------------------------------------------------
    def cmake_args(self, cpu: CpuTarget, cuda: CudaTarget, ref: str) -> list[str]:
        """Configure arguments for a targeted, host-independent build of the server only."""
        features = set(cpu.ggml_features)
        args = [
            "-DCMAKE_BUILD_TYPE=Release",
            # The build host is not the run host: never -march=native (in ik_llama.cpp it would even
            # be appended after, and so override, the targeted -march).
            "-DGGML_NATIVE=OFF",
            f"-DCMAKE_C_FLAGS=-march={cpu.march}",
            f"-DCMAKE_CXX_FLAGS=-march={cpu.march}",
            *(f"-D{flag}={'ON' if flag in features else 'OFF'}" for flag in GGML_X86_FEATURES),
            # One self-contained binary: the runtime stage copies a single file.
            "-DBUILD_SHARED_LIBS=OFF",
            "-DLLAMA_CURL=OFF",
            "-DCMAKE_C_COMPILER_LAUNCHER=ccache",
            "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
        ]
        if cuda.version is not None:
            archs = ";".join(str(a) for a in cuda.archs)
            args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={archs}"]
        return args + self.extra_cmake_args(ref)

    @abstractmethod
    def extra_cmake_args(self, ref: str) -> list[str]:
        """Engine-specific configure arguments."""

    # -- run ----------------------------------------------------------------------------------
    def server_args(self, stack: StackSpec) -> list[str]:
        """`llama-server` arguments for a stack (the image's entrypoint supplies the binary)."""
        args = [
            "--model", f"{MODEL_DIR}/{stack.model.name}",
            "--host", "0.0.0.0",
            "--port", str(CONTAINER_PORT),
            "--ctx-size", str(stack.ctx_size),
            "--threads", str(stack.threads),
            "--parallel", str(stack.parallel),
        ]
        for rule in stack.override_tensors:
            args += ["--override-tensor", rule]
        if stack.chat_template:
            args += ["--chat-template", stack.chat_template]
        return args + list(stack.extra_args)


def build_packages(cuda: CudaTarget) -> list[str]:
    """Debian packages of the toolchain stage (CUDA images get nvcc from their base image)."""
    return ["build-essential", "ca-certificates", "ccache", "cmake", "git", "ninja-build"]


def runtime_packages(cuda: CudaTarget) -> list[str]:
    """Debian packages the static server binary still needs at run time (OpenMP)."""
    return ["libgomp1"]

"""ik_llama.cpp (ikawrakow): -ot expert offload, MLA, fused MoE, IQK kernels."""

from __future__ import annotations

from pathlib import Path

from builder.engines.base import Engine


class IkLlamaCpp(Engine):
    name = "ik_llama.cpp"
    slug = "ik-llama-cpp"
    upstream_url = "https://github.com/ikawrakow/ik_llama.cpp.git"
    # ik_llama.cpp publishes no release tags; pin a full commit from 2026 main (after PR #863 made
    # flash attention and fused MoE defaults and removed -fmoe). The seed's 9c4e21a still needs
    # `-fmoe`; pass --ref 9c4e21a to reproduce it exactly.
    default_ref = "007d640098cbea95157d81846ada7fe50b9fed08"
    sdist = "ik-llama-cpp-python==0.1.5"
    sdist_subdir = "vendor/ik_llama.cpp"
    sdist_ref = "ikpy-0.1.5"  # that sdist doesn't say which commit it vendors: label it by the sdist
    # Its sdists lack common/cmake/build-info-gen-cpp.cmake; the build writes build-info.cpp itself.
    needs_build_info_shim = True

    def is_source_tree(self, path: Path) -> bool:
        return (path / "CMakeLists.txt").is_file() and (path / "ggml/src/iqk").is_dir() \
            and (path / "examples/server").is_dir()

    def extra_cmake_args(self, ref: str) -> list[str]:
        return [
            "-DLLAMA_BUILD_TESTS=OFF",
            # The server lives under examples/ here, so examples must be configured.
            "-DLLAMA_BUILD_EXAMPLES=ON",
            "-DLLAMA_BUILD_SERVER=ON",
        ]

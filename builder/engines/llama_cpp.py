"""Mainline llama.cpp (ggml-org)."""

from __future__ import annotations

from pathlib import Path

from builder.engines.llama_family import LlamaFamilyEngine


class LlamaCpp(LlamaFamilyEngine):
    name = "llama.cpp"
    slug = "llama-cpp"
    upstream_url = "https://github.com/ggml-org/llama.cpp.git"
    # The commit that llama-cpp-python 0.3.36 vendors (its CHANGELOG: "update llama.cpp to
    # ggml-org/llama.cpp@0c1e57098"): the default git build and the sdist build the tests run are
    # then the same engine. The seed's b4810 (Feb 2025) predates -cmoe/-ncmoe and current Qwen3 fixes.
    default_ref = "0c1e57098"
    sdist = "llama-cpp-python==0.3.36"
    sdist_subdir = "vendor/llama.cpp"
    sdist_ref = "0c1e57098"  # what that sdist vendors: its image is the default ref's image
    # It loads one of its libggml-cpu-* variants at run time: the `portable` target exists for it.
    runtime_dispatch = True
    fits_itself = True  # `-fit, --fit [on|off]` (MoE-aware: experts go to the CPU first) at the pinned ref
    jinja_by_default = True  # `--jinja, --no-jinja ... (default: enabled)` at the pinned ref

    def is_source_tree(self, path: Path) -> bool:
        has_server = (path / "tools/server").is_dir() or (path / "examples/server").is_dir()
        return (path / "CMakeLists.txt").is_file() and (path / "ggml").is_dir() and has_server \
            and not (path / "ggml/src/iqk").is_dir()

    def extra_cmake_args(self, ref: str) -> list[str]:
        return [
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_SERVER=ON",
            # Models are mounted, never downloaded by the server: no TLS stack in the image.
            "-DLLAMA_OPENSSL=OFF",
            # Build info from the pinned ref when the tree has no .git (sdists, tarballs).
            f"-DLLAMA_BUILD_COMMIT={ref}",
        ]

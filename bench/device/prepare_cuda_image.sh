#!/usr/bin/env bash
# Pack a built CUDA image for bench/device/cuda_image.sh, which runs it on a GPU machine without
# Docker (as a container runtime would: its own root filesystem, new namespaces, the host driver's
# libraries bound in) and against a native build of the same tree and configure arguments.
#
#   prepare_cuda_image.sh IMAGE ENGINE_TREE MODEL [PRESET]
#
# Writes .device/ (git-ignored; the device tool carries at most 64 MiB):
#   image-rootfs.tar.xz   the image's root filesystem (docker export); a CUDA 13 image's cuBLAS and
#                         cuBLASLt left out (with them it is ~600 MB): the device binds its own copy
#                         of the same release. A CUDA 12 image keeps them (the device has none).
#                         xz -9e, or XZ_LEVEL (-6: faster, a little larger).
#                         Over 40 MiB it is split into rootfs/part-aa (40 MiB, carried beside the
#                         rest by `cuda_image.sh start`), then parts of 56 MiB (one a call:
#                         `cuda_image.sh carry`, the last with `cuda_image.sh run`)
#   image-removed.txt     what was left out, with the sha256 each file has in the image
#   image-env.txt         the image's Config.Env, one per line (what a runtime starts the entrypoint with)
#   stack.yaml            `moe-stack compose --gpu nvidia --preset PRESET` for MODEL, emitted here for
#                         the device (16 physical cores), the image's flag contract checked
#   engine.tar.xz         the engine tree the image was built from (what its build never reads left out)
#   engine.cmake-args     the configure arguments the image used, ccache launchers dropped
#   native.cmake-args     with NATIVE_CMAKE_ARGS=FILE: what the native build configures with instead
#                         (an earlier image's arguments, to measure a new image against it). The
#                         native tree is the engine tree as given either way: a source edit the
#                         image's build makes (ik's cuda-no-lineinfo.sh) is not applied to it.
#   whl/                  the gguf wheel (synth_moe.py writes the model on the device)
set -euo pipefail
image=${1:?IMAGE}
tree=${2:?ENGINE_TREE}
model=${3:?MODEL (written by: python3 bench/device/stack_parts.py --write-model DIR/qwen3-235b-a22b-shapes-4l-q4_0.gguf)}
preset=${4:-qwen3-235b-a22b}
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/.device
ms=$repo/.venv/bin/moe-stack
mkdir -p "$out/whl"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

label() { docker image inspect -f "{{index .Config.Labels \"$1\"}}" "$image"; }
engine=$(label io.moe-stack.engine)
archs=$(label io.moe-stack.cuda-archs)
cpu=$(label io.moe-stack.cpu-target)
cuda=$(label io.moe-stack.cuda)
cuda_base=$(label io.moe-stack.cuda-base)

container=$(docker create "$image")
docker export "$container" >"$work/rootfs.tar"
docker rm "$container" >/dev/null
mkdir "$work/rootfs"
tar -C "$work/rootfs" -xf "$work/rootfs.tar"
: >"$out/image-removed.txt"
# The GPU machine has cuBLAS 13 (NVIDIA's PyPI wheels) and no cuBLAS 12: a CUDA 13 image's cuBLAS is
# bound from there, a CUDA 12 image's travels in its root filesystem (~550 MB, ~160 MB xz).
if [ "${cuda%%.*}" = 13 ]; then
  for lib in libcublas.so.13 libcublasLt.so.13; do
    path=$(cd "$work/rootfs" && find usr/local usr/lib -name "$lib" -type f)
    echo "$(sha256sum "$work/rootfs/$path" | cut -d' ' -f1) $(stat -c %s "$work/rootfs/$path") /$path" >>"$out/image-removed.txt"
    rm "$work/rootfs/$path"
  done
fi
rm -rf "$out/rootfs" "$out/image-rootfs.tar.xz"
tar -C "$work/rootfs" --numeric-owner -cf - . | xz -T0 "${XZ_LEVEL:--9e}" >"$work/rootfs.tar.xz"
if [ "$(stat -c %s "$work/rootfs.tar.xz")" -gt $((40 << 20)) ]; then
  mkdir -p "$out/rootfs"
  head -c 40M "$work/rootfs.tar.xz" >"$out/rootfs/part-aa"
  tail -c +$((40 * 1048576 + 1)) "$work/rootfs.tar.xz" | split -b 56M - "$out/rootfs/part-b"
else
  mv "$work/rootfs.tar.xz" "$out/image-rootfs.tar.xz"
fi
docker image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$image" | sed '/^$/d' >"$out/image-env.txt"
docker image inspect -f '{{.Id}} {{index .RepoTags 0}}' "$image" >"$out/image-id.txt"

"$ms" compose --engine "$engine" --image "$image" --model "$model" --preset "$preset" --gpu nvidia \
  --for-other-host --threads 16 -o "$out/stack.yaml" >/dev/null
grep -q 'flags-checked: true' "$out/stack.yaml" || { echo "the stack's flags were not checked" >&2; exit 1; }

"$ms" cmake-args --engine "$engine" --cuda "$cuda" --cuda-archs "$archs" --cpu "$cpu" --cuda-base "$cuda_base" \
  --no-ccache >"$out/engine.cmake-args"
rm -f "$out/native.cmake-args"
[ -z "${NATIVE_CMAKE_ARGS:-}" ] || cp "$NATIVE_CMAKE_ARGS" "$out/native.cmake-args"
# What the build never reads stays behind (docs, test models and media, tests and examples, which are
# off, Python converters, the ggml backends other than CPU and CUDA): it must fit beside the rootfs.
name=$(basename "$tree")
excludes=()
skipped=(docs models media .github github-data tests benches gguf-py conversion tools/ui/tests 'tools/mtmd/test-*')
# ik_llama.cpp's server is one of its examples.
grep -qx -- -DLLAMA_BUILD_EXAMPLES=ON "$out/engine.cmake-args" || skipped+=(examples)
for path in "${skipped[@]}" \
    ggml/src/ggml-{sycl,vulkan,opencl,cann,musa,hip,metal,webgpu,zdnn,rpc,blas,et,hexagon,openvino,virtgpu,zendnn}; do
  excludes+=(--exclude="$name/$path")
done
tar -C "$(dirname "$tree")" "${excludes[@]}" -cf - "$name" | xz -T0 -9e >"$out/engine.tar.xz"
"$repo/.venv/bin/python" -m pip download --quiet --no-deps --only-binary=:all: -d "$out/whl" "gguf==$(
  "$repo/.venv/bin/python" -c 'import importlib.metadata as m; print(m.version("gguf"))')"
du -sh "$out"/* | sort -h

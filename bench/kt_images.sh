#!/usr/bin/env bash
# KTransformers images on this machine, measured: the CPU kernel image the tests build, and the CUDA
# 12.8 image (the documented `ktransformers[sglang]`: sglang-kt, kt-kernel, torch 2.9.1 and its CUDA
# libraries) built from a wheelhouse onto a local bookworm base (`moe-stack base --suite bookworm`):
# its CUDA is torch's wheels', so it needs no nvidia/cuda image and no registry. Its build places
# SGLang's CUDA kernels for the image's archs and `ldd`s them (moe-stack-kt-gpu-libs). Prints download
# and build seconds, image sizes, and how many flags the real `sglang.launch_server --help` lists;
# then emits a stack from that image, which checks every flag moe-stack writes against them.
# Usage: bash bench/kt_images.sh [WORK_DIR]   (about 5 GB of wheels, a 10 GB image)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/var/tmp/moe-stack-kt-bench}
ms="$repo/.venv/bin/moe-stack"
py="$repo/.venv/bin/python"
base=$("$py" -c 'from builder.images.baseimage import ensure_base; print(ensure_base("debian:bookworm-slim", "moe-stack/debian:bookworm", "bookworm"))')
mkdir -p "$work/wheels-cuda" "$work/stack"
platforms=()
for tag in 2_35 2_34 2_31 2_28 2_27 2_24 2_17 2_5; do platforms+=(--platform "manylinux_${tag}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform linux_x86_64)

seconds() { local start=$EPOCHREALTIME; "$@" >"$work/last.log" 2>&1; awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }'; }
size() { docker image inspect "$1" --format '{{.Size}}' | awk '{ printf "%.2f GB", $1 / 1e9 }'; }

wheelhouse=$("$py" -c 'from tests.integration.wheelhouse import make_kt_wheelhouse; print(make_kt_wheelhouse())')
cpu_s=$(seconds "$ms" build --engine ktransformers --cpu portable --source "$wheelhouse" --ref 0.7.2 \
  --base-image "$base" --registry localhost --namespace moe-stack-bench)
cpu_image=localhost/moe-stack-bench/ktransformers:0.7.2-cpu-portable
echo "CPU kernel image: built in ${cpu_s} s from $(du -sh "$wheelhouse" | cut -f1) of wheels, $(size $cpu_image)"

dl_s=$(seconds python3 -m pip download --only-binary=:all: --python-version 3.11 --implementation cp \
  "${platforms[@]}" --dest "$work/wheels-cuda" 'ktransformers[sglang]==0.7.2')
echo "CUDA 12.8 wheelhouse: $(du -sh "$work/wheels-cuda" | cut -f1) in ${dl_s} s"
cuda_s=$(seconds "$ms" build --engine ktransformers --cuda 12.8 --cpu portable --source "$work/wheels-cuda" \
  --ref 0.7.2 --base-image "$base" --registry localhost --namespace moe-stack-bench)
cuda_image=localhost/moe-stack-bench/ktransformers:0.7.2-cuda12.8-portable
flags=$(docker image inspect $cuda_image --format '{{index .Config.Labels "io.moe-stack.server-flags"}}' \
  | "$py" -c 'import json, sys; print(len(json.load(sys.stdin)))')
os=$(docker run --rm --entrypoint cat $cuda_image /etc/os-release | sed -n 's/^PRETTY_NAME="\(.*\)"/\1/p')
origin=$(docker image inspect $cuda_image --format '{{index .Config.Labels "io.moe-stack.cuda-base"}}')
echo "CUDA 12.8 image on $os, CUDA from $origin: built in ${cuda_s} s, $(size $cuda_image), sglang --help lists $flags flags"
grep -h 'moe-stack-kt-gpu-libs' -A2 "$work/last.log" | grep -o '{.*}' | tail -1 | sed 's/^/SGLang kernels placed and linked: /' || true

# The model both loaders read: the experts' GGUF and the Hugging Face checkpoint of the same shapes.
rm -rf "$work/stack/hf"
"$ms" synth-moe "$work/stack/tiny-moe.gguf" --tiny >/dev/null
"$ms" synth-moe "$work/stack/hf" --tiny --format hf >/dev/null
chmod -R o+rX "$work/stack" && chmod o+rx "$work"
"$ms" compose --engine ktransformers --image $cuda_image --model "$work/stack/tiny-moe.gguf" \
  --config-dir "$work/stack/hf" --gpu nvidia --preset qwen3-235b-a22b --fit-vram-gb 2.05 -o "$work/stack/compose.yaml" >/dev/null
echo "stack emitted with flags checked against that --help: $(grep -c -- '- --' "$work/stack/compose.yaml") flags, $work/stack/compose.yaml"

#!/usr/bin/env bash
# KTransformers' prompt cache across a restart at several depths of the preset's widths, then the depths
# side by side and followed to the model's depth (kt_hicache_depth.py). One device call: carry .device/kt
# and .device/seed/whl, as for kt_gpu.sh. KT_HICACHE_DEPTHS: the layer counts (default "8 2": about
# 400 s with KT_HICACHE_WORDS=1500); KT_GPU_PRESET, KT_GPU_START_S and KT_HICACHE_WORDS as for kt_gpu.sh.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/kt-gpu-out}
runs=()
for layers in ${KT_HICACHE_DEPTHS:-8 2}; do
  mkdir -p "$out/layers-$layers"
  OUT="$out/layers-$layers" KT_GPU_LAYERS=$layers KT_GPU_SCRIPT=kt_hicache.py \
    bash "$repo/bench/device/kt_gpu.sh" >"$out/layers-$layers/console.log" 2>&1
  tail -n 3 "$out/layers-$layers/console.log"
  runs+=("$out/layers-$layers")
done
python3 "$repo/bench/device/kt_hicache_depth.py" "${runs[@]}" | tee "$out/depth.txt"

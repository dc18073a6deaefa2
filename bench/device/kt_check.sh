#!/usr/bin/env bash
# Issue 6 on the device (no Docker, no network): the kt-kernel wheel the KTransformers images install
# (0.7.2, cp312, trimmed to kt_kernel and its libraries: .device/kt-kernel-0.7.2-cp312.tar.xz), loaded
# natively with the device's own torch, through the images' check (dockerfiles/ktransformers/
# moe-stack-kt-check): the variant kt-kernel picks on this CPU, then every variant forced, each
# against the NumPy float64 reference. Also records why SGLang's server can't be run there.
# Usage: bash bench/device/kt_check.sh OUT_DIR
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: kt_check.sh OUT_DIR}
work=$(mktemp -d)
mkdir -p "$out" "$work/kt"
{
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
  echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2)"
  echo "cores: $(nproc) numa nodes: $(ls -d /sys/devices/system/node/node* | wc -l)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 --version
  python3 -c 'import torch, numpy; print("torch", torch.__version__, "cuda", torch.version.cuda, "numpy", numpy.__version__)'
  for module in sglang flashinfer sgl_kernel; do
    python3 -c "import $module" 2>/dev/null && echo "$module: importable" || echo "$module: not installed"
  done
} >"$out/kt-facts.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --target "$work/site" "$repo"/.device/whl/*.whl >>"$out/kt-facts.txt" 2>&1
tar -C "$work/kt" -xJf "$repo/.device/kt-kernel-0.7.2-cp312.tar.xz"
threads=$(nproc)
for variant in "" amx avx512_bf16 avx512_vbmi avx512_vnni avx512_base avx2; do
  start=$EPOCHREALTIME
  report=$(KT_KERNEL_CPU_VARIANT=$variant PYTHONPATH="$work/kt:$work/site" \
    python3 "$repo/dockerfiles/ktransformers/moe-stack-kt-check" --threads "$threads" 2>>"$out/kt.stderr" | grep '^{')
  status=$?
  printf 'override=%s exit=%s seconds=%.1f %s\n' "${variant:-none}" "$status" \
    "$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')" "$report" >>"$out/kt.txt"
done
rm -rf "$work"

#!/usr/bin/env bash
# KTransformers' server on the GPU machine (issue 27): bench/device/kt_gpu.py, over the image's Python
# packages unpacked on that machine's torch. Carry .device/kt (bench/device/prepare_kt_gpu.sh) and
# .device/seed/whl. Results in $OUT (the device tool's output folder) or /tmp/kt-gpu-out.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/kt-gpu-out}
work=/tmp/kt-gpu
rm -rf "$work" && mkdir -p "$work/site" "$work/builder-site" "$out"
tar -C "$work/site" -xJf "$repo/.device/kt/overlay.tar.xz"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/builder-site" \
  "$repo"/.device/seed/whl/*.whl
# py-spy where prepare_kt_gpu.sh downloaded it (kt_hicache.py's KT_HICACHE_PROFILE)
for wheel in "$repo"/.device/kt/py_spy-*.whl; do
  [ -e "$wheel" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target "$work/tools" "$wheel"
done
{
  grep -m1 'model name' /proc/cpuinfo
  echo "cores: $(nproc); amx: $(grep -m1 -o -w 'amx_tile' /proc/cpuinfo || echo none); avx512_bf16: $(grep -m1 -o -w 'avx512_bf16' /proc/cpuinfo || echo none)"
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
  python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  echo "numactl: $(command -v numactl || echo none); nvcc: $(nvcc --version | tail -1)"
} >"$out/facts.txt" 2>&1
# The overlay first (transformers-kt, tokenizers 0.22 over the machine's), sgl_kernel's stand-ins,
# this checkout (the builder, the image's scripts), then the builder's own dependencies.
# The image's .pth line (moe-stack-switch-interval.pth, in its site-packages there), which PYTHONPATH skips.
printf 'import site\nsite.addsitedir(%s)\n' "'$repo/dockerfiles/ktransformers'" >"$work/site/sitecustomize.py"
export PYTHONPATH="$work/site:$repo/bench/device/sgl_kernel_torch:$repo:$work/builder-site" PYTHONUNBUFFERED=1
# KT_GPU_SCRIPT=kt_hicache.py: the prompt cache across a restart instead of the preset's checks
script=${KT_GPU_SCRIPT:-kt_gpu.py}
python3 "$repo/bench/device/$script" "$out" "$work" 2>&1 | tee "$out/run-${script%.py}-${KT_GPU_PRESET:-qwen3-235b-a22b}.log"

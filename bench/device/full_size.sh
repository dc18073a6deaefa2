#!/usr/bin/env bash
# Issue 47, items 13 and 4, on the GPU machine (see bench/device/full_size.py for what is measured):
# Qwen3-Next-80B-A3B at its real shape (seed_shape("qwen3next"), 44.6 GB of Q4_0) under both llama.cpp
# engines with the preset's command, and ik_llama.cpp's own --fit against moe-stack's plan on a 24 GB card
# emulated on the H200. One verb, the same in every call of a session (each call must follow the last
# within the machine's idle release time, or the machine starts bare):
#
#   full_size.sh step      the first time: wheels, facts, the bandwidth probe (before anything else runs),
#                          both engines' llama-server built one after the other at idle CPU
#                          priority (mainline first, -j16 each), the models written (r1-8, then qn-full);
#                          every time: the cases of full_size.py whose engine and model are ready, in
#                          priority order, until $BUDGET_S (default 560) is spent; then the results so
#                          far (cumulative) into $OUT
#
# Made on the development machine (into .device/fs, git-ignored; carry .device/fs):
#   moe-stack cmake-args --engine E --cuda 13.0 --cuda-archs 90 --cpu sapphirerapids --no-ccache \
#     > .device/fs/E.cmake-args
#   tar -cJf .device/fs/E.tar.xz <engine tree> (llama-cpp-python 0.3.36's vendor/llama.cpp,
#     ik-llama-cpp-python 0.1.5's vendor/ik_llama.cpp; docs/, github-data/, media/ and *.gguf left out)
#   pip download (cp312 manylinux) gguf==0.19.0 pydantic==2.14.4 pydantic_core==2.50.5 \
#     python-on-whales==0.81.0 annotated-types typing-inspection typing_extensions -d .device/fs/whl
set -uo pipefail
repo=$(pwd)
carried=$repo/.device/fs
work=/tmp/fs
out=${OUT:-/tmp/fs-out}
start=$(date +%s)
deadline=$(( start + ${BUDGET_S:-560} ))
mkdir -p "$work/models" "$work/logs" "$out"
export PYTHONPATH="$work/site:$repo" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

build() {  # ENGINE JOBS
  local src=$work/$1
  mkdir -p "$src" && tar -C "$src" --strip-components=1 -xJf "$carried/$1.tar.xz"
  sh "$repo/dockerfiles/llama-cpp-family/build-info.sh" "$src" seed
  mapfile -t args <"$carried/$1.cmake-args"
  local began
  began=$(date +%s)
  { cmake -S "$src" -B "$src/build" -G Ninja "${args[@]}" &&
    cmake --build "$src/build" --target llama-server --parallel "$2" &&
    echo ok >"$work/$1.done"; } >"$work/$1.build.log" 2>&1 || echo failed >"$work/$1.done"
  echo "$1 build: $(( $(date +%s) - began )) s" >>"$work/build-times.txt"
}

if [ ! -e "$work/started" ]; then
  touch "$work/started"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$carried"/whl/*.whl
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node)'
    grep -E 'MemTotal' /proc/meminfo; gcc --version | head -1; nvcc --version | tail -1; df -h /tmp | tail -1
    uname -r; python3 --version
  } >"$work/facts.txt" 2>&1
  gcc -O3 -fopenmp -ffast-math -o "$work/moe-stack-bandwidth" "$repo/dockerfiles/common/moe-stack-bandwidth.c" &&
    timeout 120 "$work/moe-stack-bandwidth" 4096 >"$work/bandwidth.txt" 2>&1
  cat "$work/facts.txt" "$work/bandwidth.txt"
  # The builds at idle CPU priority: the cases (normal priority) run beside ik's build once
  # mainline's is done, and take the cores whenever they want them.
  low=(chrt --idle 0)
  "${low[@]}" true 2>/dev/null || low=(nice -n 19)
  echo "builds under: ${low[*]}" >>"$work/facts.txt"
  setsid "${low[@]}" bash -c "$(declare -f build); carried=$carried repo=$repo work=$work;
    build llama.cpp 16; build ik_llama.cpp 16" </dev/null >/dev/null 2>&1 &
  setsid bash -c "timeout 1500 python3 '$repo/bench/device/full_size.py' write '$work/models' r1-8 qn-full \
    >'$work/models.jsonl' 2>'$work/write.err'; echo \$? >'$work/write.done'" </dev/null >/dev/null 2>&1 &
fi

python3 -c "import pydantic, gguf" || { echo "wheels missing: the machine started bare?"; exit 1; }
CASES_S=$(( deadline - $(date +%s) - 25 )) timeout $(( deadline - $(date +%s) )) \
  python3 "$repo/bench/device/full_size.py" run "$work" "$out" 2>&1 | tee -a "$out/run.log"

# The disk's read rate (direct I/O, past the page cache), once a model is there: what a cold load reads at.
if [ ! -s "$work/disk.txt" ] && [ -s "$work/models/r1-8.gguf" ]; then
  timeout 20 dd if="$work/models/r1-8.gguf" of=/dev/null bs=16M count=96 iflag=direct >"$work/disk.txt" 2>&1
fi
{
  echo "== call: $(( $(date +%s) - start )) s; $(date -u)"
  cat "$work/disk.txt" 2>/dev/null
  cat "$work/facts.txt" "$work/bandwidth.txt" "$work/build-times.txt" 2>/dev/null
  for engine in llama.cpp ik_llama.cpp; do
    echo "== $engine: $(cat "$work/$engine.done" 2>/dev/null || echo building)"
    tail -c 400 "$work/$engine.build.log" 2>/dev/null | tr '\r' '\n' | tail -3
  done
  echo "== models: write exit $(cat "$work/write.done" 2>/dev/null || echo running)"
  cat "$work/models.jsonl" "$work/write.err" 2>/dev/null | tail -5
  ls -la "$work/models"
  df -h /tmp | tail -1; free -g | head -2
} >"$out/progress.txt" 2>&1
cat "$out/progress.txt"
cp "$work/results.jsonl" "$out/results.jsonl" 2>/dev/null
tar -C "$work/logs" -cJf "$out/server-logs.tar.xz" . 2>/dev/null
ls -la "$out"

#!/usr/bin/env bash
# `moe-stack tune` on the GPU machine (no Docker): native builds of both llama.cpp engines with the
# builder's configure arguments (`moe-stack cmake-args --cuda 13.0 --cuda-archs 90 --cpu sapphirerapids
# --no-ccache`, carried in .device/tune/ENGINE.cmake-args with the engine trees and the Python wheels
# the device lacks), the synthetic A3B and 235B-slice models (bench/device/models.py), and the stacks
# `moe-stack compose --preset ... --gpu nvidia` emits for them (-ngl 99, routed experts on the CPU),
# tuned by `moe-stack tune --native-bin`: the same search code a Docker host runs, on native binaries.
#
#   tune.sh start                      wheels, facts, models; both builds started in the background
#   tune.sh build ENGINE               (re)starts one build in the background
#   tune.sh run ENGINE MODEL BUDGET [TUNE OPTIONS]
#                                      waits for ENGINE's build, emits the stack, tunes it for BUDGET
#                                      (MODEL: a3b or q235b); output, tuned stack and chart to $OUT
set -uo pipefail
phase=${1:?start or run}
repo=$(pwd)
carried=$repo/.device/tune
work=/tmp/moe-tune
out=${OUT:-/tmp/moe-tune-out}
deadline=$(( $(date +%s) + ${BUDGET_S:-560} ))
mkdir -p "$work" "$out"
export PYTHONPATH="$work/site:$repo" PYTHONUNBUFFERED=1
declare -A model=([a3b]=$work/a3b-48l-q4_0.gguf [q235b]=$work/q235b-8l-q4_0.gguf)
declare -A preset=([a3b]=qwen3-next-80b-a3b [q235b]=qwen3-235b-a22b)

build() {  # ENGINE JOBS
  local src=$work/src-$1
  mkdir -p "$src" && tar -C "$src" --strip-components=1 -xJf "$carried/$1.tar.xz"
  sh "$repo/dockerfiles/llama-cpp-family/build-info.sh" "$src" tune  # ik's sdist lacks its build-info step
  mapfile -t args <"$carried/$1.cmake-args"
  { cmake -S "$src" -B "$src/build" -G Ninja "${args[@]}" &&
    cmake --build "$src/build" --target llama-bench --parallel "$2" &&
    gcc -O3 -fopenmp -ffast-math -o "$src/build/bin/moe-stack-bandwidth" "$repo/dockerfiles/common/moe-stack-bandwidth.c" &&
    echo ok >"$work/$1.done"; } >"$work/$1.log" 2>&1 || echo failed >"$work/$1.done"
}

case "$phase" in
start)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$carried"/whl/*.whl
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node)'
    grep -E 'MemTotal' /proc/meminfo; gcc --version | head -1; nvcc --version | tail -1
  } >"$out/facts.txt" 2>&1
  for engine in llama.cpp ik_llama.cpp; do
    setsid bash -c "$(declare -f build); carried=$carried repo=$repo work=$work; build $engine 8" </dev/null >/dev/null 2>&1 &
  done
  python3 "$repo/bench/device/models.py" "${model[a3b]}" "${model[q235b]}" >"$out/models.txt" 2>&1
  while [ "$(date +%s)" -lt "$deadline" ] && [ "$(ls "$work"/*.done 2>/dev/null | wc -l)" -lt 2 ]; do sleep 5; done
  for engine in llama.cpp ik_llama.cpp; do
    echo "$engine: $(cat "$work/$engine.done" 2>/dev/null || echo building) $(tail -c 150 "$work/$engine.log" | tr '\n' ' ')"
  done
  ;;
build)
  rm -rf "$work/${2:?ENGINE}.done" "$work/src-$2"
  setsid bash -c "$(declare -f build); carried=$carried repo=$repo work=$work; build $2 8" </dev/null >/dev/null 2>&1 &
  ;;
run)
  engine=${2:?ENGINE} name=${3:?a3b or q235b} budget=${4:?BUDGET}
  shift 4  # the rest goes to moe-stack tune (e.g. --prefill)
  while [ ! -f "$work/$engine.done" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
  [ "$(cat "$work/$engine.done" 2>/dev/null)" = ok ] || { echo "$engine not built: $(tail -c 400 "$work/$engine.log")"; exit 1; }
  stack=$work/$engine-$name.yaml
  python3 -m builder compose --engine "$engine" --model "${model[$name]}" --preset "${preset[$name]}" --gpu nvidia \
    --skip-image-checks --for-other-host --port 18080 -o "$stack" >"$out/$engine-$name.txt" 2>&1 || { cat "$out/$engine-$name.txt"; exit 1; }
  python3 -m builder tune "$stack" --native-bin "$work/src-$engine/build/bin" --budget "$budget" \
    --plot "$out/$engine-$name.png" "$@" 2>&1 | tee -a "$out/$engine-$name.txt"
  cp "$work/$engine-$name.tuned.yaml" "$out/" 2>/dev/null
  ;;
esac
exit 0

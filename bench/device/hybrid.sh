#!/usr/bin/env bash
# Benchmarks on the device machine (GPU + AVX-512/AMX CPU, no Docker), issue 7's P2/P3/P7 and the
# kt-kernel check of issue 6, in phases that fit the device tool's 10-minute calls:
#
#   hybrid.sh start   host facts, kt-kernel check, models written, the four builds started
#   hybrid.sh bench   once the builds are done (a quiet machine): memory bandwidth, then
#                     P2 (CPU-only decode of llama.cpp's avx2 vs sapphirerapids builds, alternating),
#                     P3 + P7 (hybrid decode and prefill of both engines, the stack's settings varied);
#                     a run that finished in an earlier call is skipped, so `bench` can be called again
#
# Each engine is built with exactly the configure arguments `moe-stack cmake-args` renders (carried in
# .device/ENGINE.VARIANT.cmake-args). Raw results go to $OUT; bench/device_report.py makes the tables.
set -uo pipefail
phase=${1:?start, cpu or gpu}
repo=$(pwd)
work=/tmp/moe-bench
out=${OUT:-/tmp/moe-bench-out}
deadline=$(( $(date +%s) + ${BUDGET_S:-560} ))
mkdir -p "$work" "$out"
export PYTHONPATH="$work/site:$repo" PYTHONUNBUFFERED=1

builds=(llama.cpp:cpu-avx2 llama.cpp:cpu-sapphirerapids llama.cpp:cuda-sapphirerapids ik_llama.cpp:cuda-sapphirerapids)
a3b=$work/a3b-48l-q4_0.gguf          # Qwen3-30B-A3B shapes, all 48 layers
q235=$work/q235b-8l-q4_0.gguf        # Qwen3-235B-A22B expert shapes, an 8-layer slice

build() {  # ENGINE VARIANT JOBS
  local engine=$1 variant=$2 jobs=$3 src="$work/src-$1-$2" done="$work/$1.$2.done"
  mkdir -p "$src" && tar -C "$src" --strip-components=1 -xJf "$repo/.device/$engine.tar.xz"
  sh "$repo/dockerfiles/llama-cpp-family/build-info.sh" "$src" bench  # a no-op for mainline
  mapfile -t args <"$repo/.device/$engine.$variant.cmake-args"
  { cmake -S "$src" -B "$src/build" -G Ninja "${args[@]}" &&
    cmake --build "$src/build" --target llama-bench --parallel "$jobs" && echo ok >"$done"; } \
    >"$work/$engine.$variant.log" 2>&1 || echo failed >"$done"
}
bench_bin() { echo "$work/src-$1-$2/build/bin/llama-bench"; }
wait_for() {  # ENGINE VARIANT: until built or the phase's deadline
  while [ ! -f "$work/$1.$2.done" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 2; done
  [ "$(cat "$work/$1.$2.done" 2>/dev/null)" = ok ]
}
run() {  # LABEL -- llama-bench args: its markdown table, appended to $work/bench.md (copied to $OUT)
  local label=$1; shift
  grep -qxF "## $label" "$work/bench.md" 2>/dev/null && return  # done in an earlier call
  [ "$(date +%s)" -lt "$deadline" ] || { echo "deadline: $label left for the next call"; return; }
  local table
  table=$("$@" -o md 2>>"$work/bench.stderr") || table="failed (exit $?)"
  printf '## %s\n`%s`\n%s\n\n' "$label" "${*/#$work\//}" "$table" >>"$work/bench.md"
}

case "$phase" in
start)
  {
    nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node)'
    grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx512f|avx512_vnni|avx512_bf16|amx_tile|amx_int8|amx_bf16|avx_vnni)$' | tr '\n' ' '
    echo; grep -E 'MemTotal|Hugepagesize' /proc/meminfo; gcc --version | head -1; nvcc --version | tail -1
  } >"$out/facts.txt" 2>&1
  jobs=$(nproc)
  # The two CUDA builds take the most cores (on 2026-11-30, ik's at 6 jobs beside three other builds
  # was half done after 19 min; at 16 jobs alone it finished the rest in about 5); the small CPU
  # builds for P2 run beside them.
  setsid bash -c "$(declare -f build); repo=$repo work=$work;
    build llama.cpp cpu-avx2 $((jobs / 8)); build llama.cpp cpu-sapphirerapids $((jobs / 8))" </dev/null >/dev/null 2>&1 &
  setsid bash -c "$(declare -f build); repo=$repo work=$work; build llama.cpp cuda-sapphirerapids $((jobs * 5 / 16))" \
    </dev/null >/dev/null 2>&1 &
  setsid bash -c "$(declare -f build); repo=$repo work=$work; build ik_llama.cpp cuda-sapphirerapids $((jobs / 2))" \
    </dev/null >/dev/null 2>&1 &
  python3 -m pip install -q --no-index --no-deps --target "$work/site" "$repo"/.device/whl/*.whl >>"$out/facts.txt" 2>&1
  mkdir -p "$work/kt" && tar -C "$work/kt" -xJf "$repo/.device/kt-kernel-0.7.2-cp312.tar.xz"
  for variant in "" avx512_base avx2; do
    KT_KERNEL_CPU_VARIANT=$variant PYTHONPATH="$work/kt:$work/site" python3 "$repo/dockerfiles/ktransformers/moe-stack-kt-check" \
      --threads 8 2>>"$out/kt.stderr" | sed "s/^/override=${variant:-none} /" >>"$out/kt.txt"
  done
  python3 "$repo/bench/device/models.py" "$a3b" "$q235" >>"$out/facts.txt" 2>&1
  while [ "$(date +%s)" -lt "$deadline" ] && [ "$(ls "$work"/*.done 2>/dev/null | wc -l)" -lt "${#builds[@]}" ]; do
    sleep 5
  done
  for b in "${builds[@]}"; do echo "$b: $(cat "$work/${b%%:*}.${b#*:}.done" 2>/dev/null || echo building) $(tail -c 120 "$work/${b%%:*}.${b#*:}.log" | tr '\n' ' ')"; done
  ;;
bench)
  [ -f "$q235" ] || python3 "$repo/bench/device/models.py" "$a3b" "$q235" >"$work/models.txt" 2>&1
  for b in "${builds[@]}"; do wait_for "${b%%:*}" "${b#*:}" || echo "build ${b}: $(cat "$work/${b%%:*}.${b#*:}.done" 2>/dev/null || echo unfinished)"; done
  if [ ! -f "$work/bandwidth.txt" ]; then
    gcc -O3 -march=native -ffast-math -fopenmp -o "$work/bandwidth" "$repo/dockerfiles/common/moe-stack-bandwidth.c" &&
      OMP_NUM_THREADS=$(nproc) OMP_PROC_BIND=spread "$work/bandwidth" >"$work/bandwidth.txt" 2>&1
  fi
  for round in 1 2; do
    for variant in cpu-avx2 cpu-sapphirerapids; do
      run "P2 round $round: llama.cpp $variant, CPU only, A3B 48 layers" \
        "$(bench_bin llama.cpp $variant)" -m "$a3b" -t 16 -p 64 -n 32 -r 2
    done
  done
  hybrid=(-ngl 99 -ot "exps=CPU")
  for engine in llama.cpp ik_llama.cpp; do
    bin=$(bench_bin "$engine" cuda-sapphirerapids)
    [ -x "$bin" ] || continue
    run "P3/P7 $engine A3B 48l: stack settings (16 threads)" "$bin" -m "$a3b" "${hybrid[@]}" -t 16 -p 512 -n 64 -r 2
    run "P3/P7 $engine 235B-shape slice: stack settings" "$bin" -m "$q235" "${hybrid[@]}" -t 16 -p 256,512 -n 64 -r 2
  done
  bin=$(bench_bin ik_llama.cpp cuda-sapphirerapids)
  if [ -x "$bin" ]; then
    run "P7 ik 235B slice: -cuda offload-batch-size=2" "$bin" -m "$q235" "${hybrid[@]}" -t 16 -p 256,512 -n 0 -r 2 \
      -cuda offload-batch-size=2
    run "P7 ik A3B 48l: -cuda offload-batch-size=2" "$bin" -m "$a3b" "${hybrid[@]}" -t 16 -p 512 -n 0 -r 2 \
      -cuda offload-batch-size=2
    run "P3 ik A3B 48l: 8 threads" "$bin" -m "$a3b" "${hybrid[@]}" -t 8 -p 0 -n 64 -r 2
    run "P3 ik 235B slice: -amb 512" "$bin" -m "$q235" "${hybrid[@]}" -t 16 -p 0 -n 64 -r 2 -amb 512
    run "P3 ik 235B slice: -fmoe 0" "$bin" -m "$q235" "${hybrid[@]}" -t 16 -p 0 -n 64 -r 2 -fmoe 0
    echo 6000 >/proc/sys/vm/nr_hugepages 2>/dev/null
    echo "hugepages reserved: $(cat /proc/sys/vm/nr_hugepages)" >"$work/hugepages.txt"
    run "P3 ik 235B slice: -thp 1" "$bin" -m "$q235" "${hybrid[@]}" -t 16 -p 0 -n 64 -r 2 -thp 1
  fi
  bin=$(bench_bin llama.cpp cuda-sapphirerapids)
  [ -x "$bin" ] && run "P3 llama.cpp A3B 48l: 8 threads" "$bin" -m "$a3b" "${hybrid[@]}" -t 8 -p 0 -n 64 -r 2
  cp "$work/bench.md" "$work/bandwidth.txt" "$work/hugepages.txt" "$work/models.txt" "$out/" 2>/dev/null
  ;;
esac
cp "$work"/*.log "$out/" 2>/dev/null
exit 0

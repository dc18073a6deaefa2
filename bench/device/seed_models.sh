#!/usr/bin/env bash
# The seed's presets on the GPU machine (issue 24, point 4), in device calls within the machine's warm
# window (see bench/device/seed_models.py for what is measured):
#
#   seed_models.sh start [CASE…]  wheels, facts, both engines' llama-server and llama-bench built in the
#                          background ($CHAINED: one after the other, mainline first or $FIRST; $TARGETS: other
#                          targets) with the builder's configure arguments (carried in
#                          .device/seed/ENGINE.cmake-args with the engine trees), the models written
#                          ($MODELS: names, default all); then the CASEs, each once its engine is built
#                          (beside the other's build: for buffer sizes, not speed), until its budget
#   seed_models.sh run CASE…      waits for the builds, the bandwidth probe, then each case's server
#                          (on ports from $PORT_BASE, default 18700: give each call its own)
#                          ($ROUNDS: the CASEs that many times over, alternating, the read bound at the
#                          start of each round)
#   seed_models.sh tune TREE MODEL BUDGET [TUNE OPTIONS]
#                          the stack `moe-stack compose --preset P --gpu nvidia` emits for MODEL here,
#                          searched by `moe-stack tune --native-bin` for BUDGET seconds (e.g. --decode
#                          --only fmoe,amb,no-mmap)
#
# The builds outlast one call (2026-12-02: after 557 s mainline had 143 of 355 objects, ik 117 of 309), and
# they live only on the machine that `start` ran on: the next call must come within the machine's idle
# release time, or it starts bare (`run` and `tune` then say so and stop).
#
# Made on the development machine:
#   moe-stack cmake-args --engine E --cuda 13.0 --cuda-archs 90 --cpu sapphirerapids --no-ccache
#     > .device/seed/E.cmake-args
#   tar -cJf .device/seed/E.tar.xz <the engine tree the images build> (llama-cpp-python 0.3.36's
#     vendor/llama.cpp, ik-llama-cpp-python 0.1.5's vendor/ik_llama.cpp)
#   pip download gguf pydantic pydantic-core python-on-whales … -d .device/seed/whl
# ($TREES: other trees than the two engines' pins, e.g. "ik_llama.cpp ik_llama.cpp@8337e4c" with
# .device/seed/ik_llama.cpp@8337e4c.tar.xz: the mirror's tree of that ref, bench/device/ik_bump.cases)
set -uo pipefail
phase=${1:?start or run}
shift
repo=$(pwd)
carried=$repo/.device/seed
work=/tmp/moe-seed
out=${OUT:-/tmp/moe-seed-out}
deadline=$(( $(date +%s) + ${BUDGET_S:-560} ))
mkdir -p "$work/models" "$out"
export PYTHONPATH="$work/site:$repo" PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The trees built: an engine's name, or ENGINE@NAME for another tree of it (its tarball .device/seed/TREE.tar.xz,
# the engine's cmake-args): e.g. TREES="ik_llama.cpp ik_llama.cpp@8337e4c" for a pin against a newer tree.
read -r -a engines <<<"${TREES:-llama.cpp ik_llama.cpp}"

build() {  # TREE JOBS
  local src=$work/$1
  mkdir -p "$src" && tar -C "$src" --strip-components=1 -xJf "$carried/$1.tar.xz"
  sh "$repo/dockerfiles/llama-cpp-family/build-info.sh" "$src" seed  # ik's sdist lacks its build-info step
  [ "${1%@*}" = ik_llama.cpp ] && sh "$repo/dockerfiles/llama-cpp-family/cuda-no-lineinfo.sh" "$src"  # as its images
  mapfile -t args <"$carried/${1%@*}.cmake-args"
  { cmake -S "$src" -B "$src/build" -G Ninja "${args[@]}" &&
    cmake --build "$src/build" --target ${TARGETS:-llama-server llama-bench} --parallel "$2" &&
    gcc -O3 -fopenmp -ffast-math -o "$src/build/bin/moe-stack-bandwidth" "$repo/dockerfiles/common/moe-stack-bandwidth.c" &&
    echo ok >"$work/$1.done"; } \
    >"$work/$1.build.log" 2>&1 || echo failed >"$work/$1.done"
}
archive_logs() {  # eight files at most come back: the servers' logs travel in one archive
  local logs=() log
  for log in "$out"/*.log; do [ -e "$log" ] && [ "${log##*/}" != run.log ] && logs+=("${log##*/}"); done
  [ "${#logs[@]}" -eq 0 ] || tar -C "$out" -cJf "$out/server-logs.tar.xz" --remove-files "${logs[@]}"
}
wait_builds() {
  local engine
  while [ "$(date +%s)" -lt "$deadline" ] && [ "$(ls "$work"/*.done 2>/dev/null | wc -l)" -lt "${#engines[@]}" ]; do
    sleep 5
  done
  for engine in "${engines[@]}"; do
    echo "$engine: $(cat "$work/$engine.done" 2>/dev/null || echo building) $(tail -c 120 "$work/$engine.build.log" | tr '\n' ' ')"
  done
}

wheels() {
  [ -d "$work/site/builder_deps_installed" ] && return
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$carried"/whl/*.whl &&
    mkdir -p "$work/site/builder_deps_installed"
}
builds_here() {  # a machine handed back between calls (idle past its release time) starts bare
  ls "$work"/*.build.log >/dev/null 2>&1 && return
  echo "no engine builds on this machine: it was handed back since \`start\` (calls must follow within" \
    "the machine's idle release time); run \`seed_models.sh start\` again" >&2
  exit 1
}

case "$phase" in
start)
  wheels
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node)'
    grep -E 'MemTotal' /proc/meminfo; gcc --version | head -1; nvcc --version | tail -1; df -h /tmp | tail -1
  } >"$out/facts.txt" 2>&1
  if [ -n "${CHAINED:-}" ]; then  # one engine after the other on every core (its cases start while the
    # next builds): mainline first, or $FIRST
    first=${FIRST:-llama.cpp} second=ik_llama.cpp
    [ "$first" = ik_llama.cpp ] && second=llama.cpp
    setsid bash -c "$(declare -f build); carried=$carried repo=$repo work=$work TARGETS='${TARGETS:-}';
      build $first $(nproc); build $second $(nproc)" </dev/null >/dev/null 2>&1 &
  elif [ -z "${TREES:-}" ]; then  # ik's CUDA build is the longer (its flash-attention and MMQ instances):
    # it gets most of the cores.
    setsid bash -c "$(declare -f build); carried=$carried repo=$repo work=$work; build ik_llama.cpp 10" </dev/null >/dev/null 2>&1 &
    setsid bash -c "$(declare -f build); carried=$carried repo=$repo work=$work; build llama.cpp 6" </dev/null >/dev/null 2>&1 &
  else  # the trees side by side, the cores shared evenly
    for tree in "${engines[@]}"; do
      setsid bash -c "$(declare -f build); carried=$carried repo=$repo work=$work; build $tree $(( $(nproc) / ${#engines[@]} ))" \
        </dev/null >/dev/null 2>&1 &
    done
  fi
  gcc -O3 -fopenmp -ffast-math -o "$work/moe-stack-bandwidth" "$repo/dockerfiles/common/moe-stack-bandwidth.c"
  # shellcheck disable=SC2086  # MODELS: names, split
  time python3 "$repo/bench/device/seed_models.py" write "$work/models" ${MODELS:-} 2>&1 | tee "$out/models.jsonl"
  [ "$#" -eq 0 ] || CASES_S=$(( deadline - $(date +%s) - 20 )) python3 "$repo/bench/device/seed_models.py" run \
    "$work/models" "$work" "$out" "$@" 2>&1 | tee -a "$out/run.log"
  wait_builds
  archive_logs
  ;;
run)
  builds_here
  wheels
  [ -n "${CHAINED:-}" ] || wait_builds  # chained: each case waits for its own engine (seed_models.py)
  for engine in "${engines[@]}"; do
    [ "$(cat "$work/$engine.done" 2>/dev/null)" = ok ] || tail -5 "$work/$engine.build.log" 2>/dev/null
  done
  if [ ! -s "$out/bandwidth.txt" ]; then
    gcc -O3 -fopenmp -ffast-math -o "$work/moe-stack-bandwidth" "$repo/dockerfiles/common/moe-stack-bandwidth.c" &&
      "$work/moe-stack-bandwidth" 4096 >"$out/bandwidth.txt" 2>&1
    cat "$out/bandwidth.txt"
  fi
  CASES_S=$(( deadline - $(date +%s) - 20 )) python3 "$repo/bench/device/seed_models.py" run "$work/models" "$work" \
    "$out" "$@" 2>&1 | tee -a "$out/run.log"
  archive_logs
  ;;
tune)
  engine=${1:?ENGINE} name=${2:?MODEL} budget=${3:?BUDGET}
  shift 3  # the rest goes to moe-stack tune (e.g. --prefill)
  builds_here
  wheels
  preset=$(python3 -c "import sys; sys.path.insert(0, '$repo/bench/device'); from seed_models import MODELS; print(MODELS['$name'][0])")
  wait_builds
  [ "$(cat "$work/$engine.done" 2>/dev/null)" = ok ] || { tail -30 "$work/$engine.build.log"; exit 1; }
  stack=$work/$engine-$name.yaml
  tag=$engine-$name$(printf '%s' "$*" | tr -c 'a-z0-9' '-')  # one file per tune: decode, prefill
  python3 -m builder compose --engine "${engine%@*}" --model "$work/models/$name.gguf" --preset "$preset" --gpu nvidia \
    --skip-image-checks --for-other-host --port 18080 -o "$stack" >"$out/tune-$tag.txt" 2>&1 ||
    { cat "$out/tune-$tag.txt"; exit 1; }
  python3 -m builder tune "$stack" --native-bin "$work/$engine/build/bin" --budget "${budget}s" \
    --plot "$out/tune-$tag.png" "$@" 2>&1 | tee -a "$out/tune-$tag.txt"
  cp "$work/$engine-$name.tuned.yaml" "$out/tune-$tag.tuned.yaml" 2>/dev/null
  ;;
esac

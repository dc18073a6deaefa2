#!/usr/bin/env bash
# Issue 46, part 2 in hybrid: ik_llama.cpp's decode with all layers on the H200 and the routed experts in
# CPU RAM (the R1 preset's layout), each lever of the CPU side and the GPU side, against the read bound
# measured beside it. One pipeline runs in the background (setsid) and outlives a call; each call waits
# on it until its budget and copies what is done to $OUT:
#
#   decode_hybrid.sh start   facts; ik_llama.cpp with CUDA (the image's configure arguments, carried in
#                            $CARRIED/ik_llama.cpp.cuda.cmake-args) beside writing the slices; the 4-bit
#                            variants (llama-quantize --pure); then REPEATS rounds, each every candidate
#                            once in turn, the bound read at the start of each round
#   decode_hybrid.sh wait    waits for the pipeline (the machine must still be the one `start` ran on)
#
# A candidate is SLICE:TYPE[:LEVER...]; a lever is a llama-bench flag pair without its dash (rtr=1,
# gr=1, sas=1, muge=1, t=8) or `gpu`, every tensor on the GPU (the GPU side's own time per token).
# Carried: $CARRIED/ik_llama.cpp.tar.xz (ik-llama-cpp-python 0.1.5's vendor/ik_llama.cpp), $CARRIED/whl.
set -uo pipefail
repo=$(pwd)
carried=${CARRIED:-$repo/.device/fs}
work=/tmp/decode-hybrid
res=$work/res
deadline=$(( $(date +%s) + ${BUDGET_S:-560} ))
REPEATS=${REPEATS:-3} NGEN=${NGEN:-64}
# R1 widths: 12 layers, 3 dense, 9 MoE layers of 32 experts (a token reads 8 of each: 1.78 GB of Q4_0).
# Qwen3-235B widths: 12 MoE layers of 32 experts (8 read: 1.02 GB of Q4_0).
R1="synth_shape('deepseek2', layers=12, experts=32, quant='Q4_0')"
Q235="synth_shape('qwen3moe', layers=12, experts=32, quant='Q4_0')"
CANDIDATES=${CANDIDATES:-"r1:Q4_0 r1:Q4_0:rtr=1 r1:Q4_0_R8 r1:IQ4_XS r1:IQ4_XS:rtr=1 r1:Q4_0_R8:gr=1
  r1:Q4_0_R8:sas=1 r1:Q4_0_R8:muge=1 r1:Q4_0_R8:t=12 r1:Q4_0:gpu q235:Q4_0 q235:Q4_0_R8 q235:Q4_0:gpu"}
# The preset's (compose/deepseek-r1-671b.ik_llama.cpp.yaml) as llama-bench takes them; -mla on R1 only.
PRESET=(-ngl 99 -fa 1 -ctk q8_0 -b 2048 -ub 2048)
EXPERTS_ON_CPU='blk\.[0-9]+\.ffn_.*_exps\.weight=CPU'

build() {
  mkdir -p "$work/ik" && tar -C "$work/ik" --strip-components=1 -xJf "$carried/ik_llama.cpp.tar.xz" &&
    sh "$repo/dockerfiles/llama-cpp-family/build-info.sh" "$work/ik" seed &&
    mapfile -t args <"$carried/ik_llama.cpp.cuda.cmake-args" &&
    cmake -S "$work/ik" -B "$work/ik/build" -G Ninja "${args[@]}" &&
    cmake --build "$work/ik/build" --target llama-bench llama-quantize --parallel 16
}

models() {  # each slice in Q4_0, with what a token reads (routed experts; all tensors)
  python3 -c "
from pathlib import Path
from builder.models.synth_families import synth_shape
from builder.models.synth_moe import write_moe_gguf
from builder.models.planner import read_facts
for name, shape in (('r1', $R1), ('q235', $Q235)):
    path = Path('$work') / f'{name}-Q4_0.gguf'
    write_moe_gguf(path, shape)
    facts = read_facts(path)
    print(name, 'routed_bytes_per_token', facts.read_per_token(True), 'all_bytes_per_token',
          facts.read_per_token(False), 'file_bytes', path.stat().st_size, flush=True)"
}

quantize() {  # every type the candidates name, from the slice's Q4_0 file, every tensor of that type
  local cand slice type
  for cand in $CANDIDATES; do
    IFS=: read -r slice type _ <<<"$cand"
    [ -s "$work/$slice-$type.gguf" ] && continue
    local t0=$SECONDS
    "$work/ik/build/bin/llama-quantize" --allow-requantize --pure \
      "$work/$slice-Q4_0.gguf" "$work/$slice-$type.gguf" "$type" 16 >"$res/quantize-$slice-$type.log" 2>&1
    echo "$slice $type quantized in $((SECONDS - t0)) s: $(tail -1 "$res/quantize-$slice-$type.log")"
  done
  ls -l "$work"/*.gguf
}

bench_args() {  # CANDIDATE: llama-bench's arguments
  local slice type levers lever
  IFS=: read -r slice type levers <<<"$1"
  local args=(-m "$work/$slice-$type.gguf" "${PRESET[@]}" -p 0 -n "$NGEN" -r 2 -o csv)
  [ "$slice" = r1 ] && args+=(-mla 3)
  [[ ":$levers:" == *:gpu:* ]] || args+=(-ot "$EXPERTS_ON_CPU")
  [[ ":$levers:" == *:t=* ]] || args+=(-t 16)
  for lever in ${levers//:/ }; do
    [ "$lever" = gpu ] || args+=("-${lever%%=*}" "${lever#*=}")
  done
  printf '%s\n' "${args[@]}"
}

bench() {  # REPEATS rounds, each every candidate once, in turn
  local round cand
  for round in $(seq "$REPEATS"); do
    echo "== round $round: the bound"; "$work/bw" 4096 --rounds 5 | grep GB/s
    for cand in $CANDIDATES; do
      mapfile -t args < <(bench_args "$cand")
      echo "== round $round $cand: ${args[*]}"
      "$work/ik/build/bin/llama-bench" "${args[@]}" 2>>"$res/bench-stderr.log" |
        sed "s/^/$cand,$round,/" | tee -a "$res/bench.csv"
    done
  done
}

pipeline() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node|L3)'
    grep -E 'MemTotal|Huge' /proc/meminfo; cat /sys/kernel/mm/transparent_hugepage/enabled
    gcc --version | head -1; nvcc --version | tail -1; df -h /tmp | tail -1
  } >"$res/facts.txt" 2>&1
  gcc -O3 -fopenmp -march=sapphirerapids -o "$work/bw" "$repo/dockerfiles/common/moe-stack-bandwidth.c"
  build >"$res/build.log" 2>&1 & local builder=$!
  local t0=$SECONDS
  models >>"$res/models.txt" 2>&1
  echo "models written in $((SECONDS - t0)) s" >>"$res/progress.txt"
  wait "$builder" || { echo "build failed" >>"$res/progress.txt"; return 1; }
  echo "built at $((SECONDS - t0)) s" >>"$res/progress.txt"
  quantize >>"$res/progress.txt" 2>&1
  bench >"$res/bench.log" 2>&1
  echo "bench done at $((SECONDS - t0)) s" >>"$res/progress.txt"
}

collect() {  # wait for the pipeline until the budget, then copy the results
  while [ "$(date +%s)" -lt "$deadline" ] && [ ! -e "$work/done" ]; do sleep 5; done
  cat "$res/progress.txt" "$res/models.txt" 2>/dev/null; tail -3 "$res/build.log" 2>/dev/null
  tail -4 "$res/bench.log" 2>/dev/null
  [ -z "${OUT:-}" ] || tar -C "$work" -cJf "$OUT/res.tar.xz" res
}

case "${1:?start or wait}" in
start)
  rm -f "$work/done"
  mkdir -p "$res"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$carried"/whl/*.whl
  export PYTHONPATH="$work/site:$repo"
  echo "start $(date +%s)" >"$res/progress.txt"
  setsid bash -c "$(declare -f build models quantize bench_args bench pipeline); $(declare -p PRESET)
    work=$work res=$res repo=$repo carried=$carried REPEATS=$REPEATS NGEN=$NGEN R1=\"$R1\" Q235=\"$Q235\"
    EXPERTS_ON_CPU='$EXPERTS_ON_CPU' CANDIDATES='$(echo $CANDIDATES)' PYTHONPATH=$PYTHONPATH; pipeline; touch $work/done" \
    </dev/null >"$work/pipeline.log" 2>&1 &
  sleep 45; cat "$work/pipeline.log" "$res/models.txt" 2>/dev/null
  collect
  ;;
wait)
  [ -d "$res" ] || { echo "no pipeline on this machine: it was handed back since \`start\`" >&2; exit 1; }
  collect
  ;;
esac

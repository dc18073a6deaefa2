#!/usr/bin/env bash
# Issue 46, part 2 in hybrid: decode with all layers on the H200 and the routed experts in CPU RAM (the R1
# preset's layout), under ik_llama.cpp and mainline llama.cpp, each lever of the CPU side and the GPU side,
# against the read bound measured beside it. One pipeline runs in the background (setsid) and outlives a
# call; each call waits on it until its budget and copies what is done to $OUT:
#
#   decode_hybrid.sh start   facts; both engines with CUDA (the images' configure arguments, carried in
#                            $CARRIED/<engine>.cuda.cmake-args), built side by side beside writing the
#                            slices; the 4-bit variants (ik's llama-quantize); then REPEATS rounds, each
#                            every candidate once in turn, the bound read at the start of each round
#   decode_hybrid.sh wait    waits for the pipeline (the machine must still be the one `start` ran on)
#   decode_hybrid.sh rebench the rounds alone again, on the builds and files `start` left (same machine),
#                            into res2/ until the budget (the 2026-12-03 levers run: its first rounds'
#                            output was lost, and its round 1 overlapped that pipeline's tail)
#
# A candidate is ENGINE/SLICE:TYPE[:LEVER...]. ENGINE is ik (ik_llama.cpp) or ml (mainline llama.cpp).
# SLICE is r1, q235 (decode: 32 experts, 12 layers) or r1p (prefill: R1's 256 experts, so that the GPU
# offload threshold and the experts' upload per micro-batch are the real model's; 1 dense + 3 MoE layers).
# TYPE is a whole-file type (Q4_0 is the slice as written; others every tensor, llama-quantize --pure) or
# exps=TYPE: the routed experts alone repacked offline into TYPE, every other tensor as written (what a
# user does once with --custom-q to keep mmap and fast loads). A lever is a llama-bench flag pair without
# its dash (rtr=1, gr=1, sas=1, muge=1, thp=1, t=12, amb=512, cuda=offload-batch-size=1; -repack=0 for
# mainline's --repack; b= and ub= replace the preset's 2048), `gpu`, every tensor on the GPU (the GPU
# side's own time per token), or `pp`: prefill of PROMPTS tokens instead of decode.
# Carried: $CARRIED/ik_llama.cpp.tar.xz (ik-llama-cpp-python 0.1.5's vendor/ik_llama.cpp),
# $CARRIED/llama.cpp.tar.xz (the pinned mainline ref), their cmake-args, $CARRIED/whl.
set -uo pipefail
repo=$(pwd)
carried=${CARRIED:-$repo/.device/fs}
work=/tmp/decode-hybrid
res=$work/res
deadline=$(( $(date +%s) + ${BUDGET_S:-560} ))
REPEATS=${REPEATS:-3} NGEN=${NGEN:-32}
# R1 widths: 12 layers, 3 dense, 9 MoE layers of 32 experts (a token reads 8 of each: 1.78 GB of Q4_0).
# Qwen3-235B widths: 12 MoE layers of 32 experts (8 read: 1.02 GB of Q4_0).
R1="synth_shape('deepseek2', layers=12, experts=32, quant='Q4_0')"
Q235="synth_shape('qwen3moe', layers=12, experts=32, quant='Q4_0')"
# R1 widths with all 256 experts (8 groups, top-4 groups): 1 dense + 3 MoE layers, 6.3 GB of experts each.
R1P="synth_shape('deepseek2', layers=4, dense_layers=1, quant='Q4_0')"
PROMPTS=${PROMPTS:-2048,8192}
CANDIDATES=${CANDIDATES:-"ik/r1:Q4_0 ik/r1:Q4_0:rtr=1 ik/r1:exps=Q4_0_R8 ik/r1:exps=Q4_0_R8:gr=1
  ik/r1:exps=Q4_0_R8:sas=1 ik/r1:exps=Q4_0_R8:muge=1 ik/r1:exps=Q4_0_R8:thp=1 ik/r1:exps=Q4_0_R8:t=12
  ik/r1:Q4_0:gpu ik/q235:Q4_0 ik/q235:Q4_0:rtr=1 ik/q235:exps=Q4_0_R8 ik/q235:Q4_0:gpu
  ml/r1:Q4_0 ml/r1:Q4_0:-repack=0 ml/r1:Q4_0:gpu ml/q235:Q4_0 ml/q235:Q4_0:gpu"}
# The presets' (compose/deepseek-r1-671b.*.yaml) as llama-bench takes them (and -b/-ub 2048, below); -mla
# on R1 under ik only.
PRESET=(-ngl 99 -ctk q8_0)
EXPERTS_ON_CPU='blk\.[0-9]+\.ffn_.*_exps\.weight=CPU'

build() {  # ENGINE (ik or ml) TARBALL CMAKE-ARGS TARGET...: both at once share the 16 cores
  local dir=$work/$1 tarball=$2 args_file=$3
  shift 3
  mkdir -p "$dir" && tar -C "$dir" --strip-components=1 -xJf "$carried/$tarball" &&
    sh "$repo/dockerfiles/llama-cpp-family/build-info.sh" "$dir" seed &&
    mapfile -t args <"$carried/$args_file" &&
    cmake -S "$dir" -B "$dir/build" -G Ninja "${args[@]}" &&
    cmake --build "$dir/build" --target "$@" --parallel 16
}

models() {  # each slice the candidates name, in Q4_0, with what a token reads (routed experts; all tensors)
  python3 -c "
from pathlib import Path
from builder.models.synth_families import synth_shape
from builder.models.synth_moe import write_moe_gguf
from builder.models.gguf_facts import read_facts
named = {c.split('/')[1].split(':')[0] for c in '$(echo $CANDIDATES)'.split()}
for name, shape in (('r1', $R1), ('q235', $Q235), ('r1p', $R1P)):
    if name not in named:
        continue
    path = Path('$work') / f'{name}-Q4_0.gguf'
    write_moe_gguf(path, shape)
    facts = read_facts(path)
    print(name, 'routed_bytes_per_token', facts.read_per_token(True), 'all_bytes_per_token',
          facts.read_per_token(False), 'file_bytes', path.stat().st_size, flush=True)"
}

quantize() {  # every type the candidates name, from the slice's Q4_0 file
  local cand slice type how
  for cand in $CANDIDATES; do
    IFS=: read -r slice type _ <<<"${cand#*/}"
    [ -s "$work/$slice-$type.gguf" ] && continue
    if [[ $type == exps=* ]]; then  # the experts alone; every other quantized tensor stays Q4_0
      how=(--custom-q "ffn_.*_exps\\.weight=${type#exps=},.*=q4_0" Q4_0)
      how[1]=${how[1],,}
    else
      how=(--pure "$type")
    fi
    local t0=$SECONDS
    "$work/ik/build/bin/llama-quantize" --allow-requantize "${how[@]:0:${#how[@]}-1}" \
      "$work/$slice-Q4_0.gguf" "$work/$slice-$type.gguf" "${how[-1]}" 16 >"$res/quantize-$slice-$type.log" 2>&1
    echo "$slice $type quantized in $((SECONDS - t0)) s: $(tail -1 "$res/quantize-$slice-$type.log")"
  done
  ls -l "$work"/*.gguf
}

bench_args() {  # CANDIDATE: llama-bench's arguments
  local engine=${1%%/*} slice type levers lever
  IFS=: read -r slice type levers <<<"${1#*/}"
  local b=2048 ub=2048 run=(-p 0 -n "$NGEN")
  for lever in ${levers//:/ }; do
    case $lever in b=*) b=${lever#b=} ;; ub=*) ub=${lever#ub=} ;; pp) run=(-p "$PROMPTS" -n 0) ;; esac
  done
  local args=(-m "$work/$slice-$type.gguf" "${PRESET[@]}" -b "$b" -ub "$ub" "${run[@]}" -r 2 -o csv)
  if [ "$engine" = ik ]; then
    args+=(-fa 1)
    [[ $slice == r1* ]] && args+=(-mla 3)
  else
    args+=(-fa on -ctv q8_0)  # as mainline's R1 preset: for an MLA model src/llama-context.cpp refuses
  fi                          # K and V cache types that differ (the levers run lost its mainline R1 rows so)
  [[ ":$levers:" == *:gpu:* ]] || args+=(-ot "$EXPERTS_ON_CPU")
  [[ ":$levers:" == *:t=* ]] || args+=(-t 16)
  for lever in ${levers//:/ }; do
    case $lever in gpu | pp | b=* | ub=*) ;; *) args+=("-${lever%%=*}" "${lever#*=}") ;; esac
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
      "$work/${cand%%/*}/build/bin/llama-bench" "${args[@]}" 2>>"$res/bench-stderr.log" |
        sed "s#^#$cand,$round,#" | tee -a "$res/bench.csv"
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
  build ik ik_llama.cpp.tar.xz ik_llama.cpp.cuda.cmake-args llama-bench llama-quantize >"$res/build-ik.log" 2>&1 &
  local ik=$!
  build ml llama.cpp.tar.xz llama.cpp.cmake-args llama-bench >"$res/build-ml.log" 2>&1 &
  local ml=$!
  local t0=$SECONDS
  models >>"$res/models.txt" 2>&1
  echo "models written in $((SECONDS - t0)) s" >>"$res/progress.txt"
  wait "$ik" || { echo "ik build failed" >>"$res/progress.txt"; return 1; }
  echo "ik built at $((SECONDS - t0)) s" >>"$res/progress.txt"
  quantize >>"$res/progress.txt" 2>&1
  wait "$ml" || echo "mainline build failed: its candidates are left out" >>"$res/progress.txt"
  echo "built at $((SECONDS - t0)) s" >>"$res/progress.txt"
  bench >"$res/bench.log" 2>&1
  echo "bench done at $((SECONDS - t0)) s" >>"$res/progress.txt"
}

collect() {  # wait for the pipeline until the budget, then copy the results
  while [ "$(date +%s)" -lt "$deadline" ] && [ ! -e "$work/done" ]; do sleep 5; done
  cat "$res/progress.txt" "$res/models.txt" 2>/dev/null; tail -n 3 "$res"/build-*.log 2>/dev/null
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
    work=$work res=$res repo=$repo carried=$carried REPEATS=$REPEATS NGEN=$NGEN PROMPTS=$PROMPTS
    R1=\"$R1\" Q235=\"$Q235\" R1P=\"$R1P\"
    EXPERTS_ON_CPU='$EXPERTS_ON_CPU' CANDIDATES='$(echo $CANDIDATES)' PYTHONPATH=$PYTHONPATH; pipeline; touch $work/done" \
    </dev/null >"$work/pipeline.log" 2>&1 &
  sleep 45; cat "$work/pipeline.log" "$res/models.txt" 2>/dev/null
  collect
  ;;
wait)
  [ -d "$res" ] || { echo "no pipeline on this machine: it was handed back since \`start\`" >&2; exit 1; }
  collect
  ;;
rebench)
  [ -e "$work/done" ] || { echo "no finished pipeline on this machine: run \`start\` first" >&2; exit 1; }
  res=$work/res2
  mkdir -p "$res" && cp "$work/res/models.txt" "$work/res/facts.txt" "$work/res/progress.txt" "$res/"
  timeout $((deadline - $(date +%s))) bash -c "$(declare -f bench_args bench); $(declare -p PRESET)
    work=$work res=$res REPEATS=$REPEATS NGEN=$NGEN PROMPTS=$PROMPTS EXPERTS_ON_CPU='$EXPERTS_ON_CPU'
    CANDIDATES='$(echo $CANDIDATES)'; bench" >"$res/bench.log" 2>&1
  [ -z "${OUT:-}" ] || tar -C "$work" -cJf "$OUT/res2.tar.xz" res2
  ;;
esac

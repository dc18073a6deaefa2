#!/usr/bin/env bash
# Issue 46 on the GPU machine's CPU (16 Emerald Rapids cores): the true read bound, and CPU-only decode of
# ik_llama.cpp's 4-bit expert types against it. One pipeline runs in the background (setsid) and outlives
# a call; each call waits on it until its budget and copies what is done to $OUT:
#
#   decode_bound.sh start   facts; the bandwidth tool (the image's -march, native, none; 4k/thp pages)
#                           alternating with the reference read loop; then ik_llama.cpp CPU-only
#                           (llama-bench, llama-quantize) beside the R1-width slice's writing; the
#                           4-bit variants; llama-bench rounds alternating the candidates
#   decode_bound.sh wait    waits for the pipeline (the machine must still be the one `start` ran on)
#
# Carried (ignored paths of the checkout): $CARRIED/ik_llama.cpp.tar.xz (ik-llama-cpp-python 0.1.5's
# vendor/ik_llama.cpp), $CARRIED/whl (gguf and the builder's wheels); BANDWIDTH_SRC and REFERENCE_SRC
# name the C sources when the checkout's are older than the ones measured.
set -uo pipefail
repo=$(pwd)
carried=${CARRIED:-$repo/.device/fs}
bw_src=${BANDWIDTH_SRC:-$repo/dockerfiles/common/moe-stack-bandwidth.c}
ref_src=${REFERENCE_SRC:-$repo/tests/unit/data/read_reference.c}
work=/tmp/decode-bound
res=$work/res
deadline=$(( $(date +%s) + ${BUDGET_S:-560} ))
# The R1-width slice: 6 layers, 1 dense, 5 MoE layers of 32 experts (a token reads 8 of each layer's).
LAYERS=${LAYERS:-6} EXPERTS=${EXPERTS:-32} REPEATS=${REPEATS:-3} NGEN=${NGEN:-64}
CANDIDATES=${CANDIDATES:-"Q4_0 Q4_0:rtr Q4_0_R8 Q4_K_S Q4_K_S:rtr IQ4_XS IQ4_XS:rtr IQ4_KS IQ4_KS:rtr Q8_0:rtr"}
CPU_ARGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DCMAKE_C_FLAGS=-march=sapphirerapids
  -DCMAKE_CXX_FLAGS=-march=sapphirerapids -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_AVX_VNNI=ON
  -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON
  -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=ON -DGGML_AMX_INT8=ON -DGGML_AMX_BF16=ON -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON)  # moe-stack cmake-args --engine ik_llama.cpp --cpu sapphirerapids --no-ccache

bandwidth() {  # the tool three ways and the reference, alternating
  local m
  for m in sapphirerapids native none; do
    gcc -O3 -fopenmp -Wall -Wextra -Werror "-march=${m/none/x86-64}" -o "$work/bw-$m" "$bw_src" 2>&1
  done
  gcc -O3 -fopenmp -march=native -o "$work/ref" "$ref_src"
  gcc -O3 -fopenmp -march=native -mprefer-vector-width=512 -o "$work/ref512" "$ref_src"
  [ -z "${OLD_SRC:-}" ] || gcc -O3 -fopenmp -ffast-math -o "$work/old" "$OLD_SRC"
  for round in $(seq "${BW_ROUNDS:-3}"); do
    for m in sapphirerapids native none; do
      echo "== round $round: tool -march=$m, default pages"; "$work/bw-$m" 4096 --rounds 9
    done
    echo "== round $round: tool -march=sapphirerapids, thp"; "$work/bw-sapphirerapids" 4096 --pages thp
    echo "== round $round: tool -march=sapphirerapids, 4k"; "$work/bw-sapphirerapids" 4096 --pages 4k
    echo "== round $round: reference"; "$work/ref" 4096 9
    echo "== round $round: reference, pinned"; OMP_PROC_BIND=close OMP_PLACES=cores "$work/ref" 4096 9
    echo "== round $round: reference, 512-bit"; "$work/ref512" 4096 9
    [ -z "${OLD_SRC:-}" ] || { echo "== round $round: the old tool"; "$work/old" 4096; }
  done
}

build() {
  mkdir -p "$work/ik" && tar -C "$work/ik" --strip-components=1 -xJf "$carried/ik_llama.cpp.tar.xz" &&
    sh "$repo/dockerfiles/llama-cpp-family/build-info.sh" "$work/ik" seed &&
    cmake -S "$work/ik" -B "$work/ik/build" -G Ninja "${CPU_ARGS[@]}" &&
    cmake --build "$work/ik/build" --target llama-bench llama-quantize --parallel 16
}

model() {
  python3 -c "
from pathlib import Path
from builder.models.synth_moe import write_moe_gguf
from builder.models.synth_shapes import seed_shape
write_moe_gguf(Path('$work/r1-Q4_0.gguf'), seed_shape('deepseek2', layers=$LAYERS, experts=$EXPERTS, dense_layers=1, quant='Q4_0'))"
}

quantize() {  # every type of the candidates, from the Q4_0 file, all tensors of that type
  local type
  for type in $(printf '%s\n' $CANDIDATES | cut -d: -f1 | sort -u); do
    [ -s "$work/r1-$type.gguf" ] && continue
    local t0=$SECONDS
    "$work/ik/build/bin/llama-quantize" --allow-requantize --pure \
      "$work/r1-Q4_0.gguf" "$work/r1-$type.gguf" "$type" 16 >"$res/quantize-$type.log" 2>&1
    echo "$type quantized in $((SECONDS - t0)) s: $(tail -1 "$res/quantize-$type.log")"
  done
  ls -l "$work"/*.gguf
}

bench() {  # REPEATS rounds, each every candidate once, in turn
  local round cand type rtr
  for round in $(seq "$REPEATS"); do
    echo "== round $round: the bound"; "$work/bw-sapphirerapids" 4096 --rounds 5 | grep GB/s
    for cand in $CANDIDATES; do
      type=${cand%%:*} rtr=0
      [ "$cand" != "$type" ] && rtr=1
      echo "== round $round $cand"
      "$work/ik/build/bin/llama-bench" -m "$work/r1-$type.gguf" -p 0 -n "$NGEN" -t 16 -r 2 -rtr "$rtr" -o csv \
        2>>"$res/bench-stderr.log" | sed "s/^/$cand,$round,/" | tee -a "$res/bench.csv"
    done
  done
}

pipeline() {
  {
    lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA node|L3)'
    grep -E 'MemTotal|Huge' /proc/meminfo; cat /sys/kernel/mm/transparent_hugepage/enabled
    gcc --version | head -1; df -h /tmp | tail -1
  } >"$res/facts.txt" 2>&1
  bandwidth >"$res/bandwidth.txt" 2>&1
  echo "bandwidth done $(date +%s)" >>"$res/progress.txt"
  build >"$res/build.log" 2>&1 & local builder=$!
  local t0=$SECONDS
  model >>"$res/progress.txt" 2>&1
  echo "model written in $((SECONDS - t0)) s" >>"$res/progress.txt"
  wait "$builder" || { echo "build failed" >>"$res/progress.txt"; return 1; }
  echo "built $(date +%s)" >>"$res/progress.txt"
  quantize >>"$res/progress.txt" 2>&1
  bench >"$res/bench.log" 2>&1
  echo "bench done $(date +%s)" >>"$res/progress.txt"
}

collect() {  # wait for the pipeline until the budget, then copy the results
  while [ "$(date +%s)" -lt "$deadline" ] && [ ! -e "$work/done" ]; do sleep 5; done
  cat "$res/progress.txt" 2>/dev/null; tail -3 "$res/build.log" 2>/dev/null
  [ -z "${OUT:-}" ] || tar -C "$work" -cJf "$OUT/res.tar.xz" res
}

case "${1:?start or wait}" in
start)
  rm -f "$work/done"
  mkdir -p "$res"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" "$carried"/whl/*.whl
  export PYTHONPATH="$work/site:$repo"
  echo "start $(date +%s)" >"$res/progress.txt"
  setsid bash -c "$(declare -f bandwidth build model quantize bench pipeline); $(declare -p CPU_ARGS)
    work=$work res=$res repo=$repo carried=$carried bw_src=$bw_src ref_src=$ref_src OLD_SRC=${OLD_SRC:-} LAYERS=$LAYERS EXPERTS=$EXPERTS
    BW_ROUNDS=${BW_ROUNDS:-3} REPEATS=$REPEATS NGEN=$NGEN CANDIDATES='$CANDIDATES' PYTHONPATH=$PYTHONPATH; pipeline; touch $work/done" \
    </dev/null >"$work/pipeline.log" 2>&1 &
  sleep 60; cat "$res/bandwidth.txt"
  collect
  ;;
wait)
  [ -d "$res" ] || { echo "no pipeline on this machine: it was handed back since \`start\`" >&2; exit 1; }
  collect
  ;;
esac

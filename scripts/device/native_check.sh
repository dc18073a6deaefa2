#!/usr/bin/env bash
# Native check of one matrix variant on a GPU host without Docker: build both engines with exactly
# the configure arguments `moe-stack cmake-args` renders (written beforehand to .device/ENGINE.cmake-args,
# ccache launchers dropped), then run them on the GPU with experts on the CPU.
#
#   native_check.sh build   unpack .device/ENGINE.tar.xz, configure, start both builds in the background
#   native_check.sh run     wait for the builds, record binary facts, llama-bench and a server completion
#
# Results go to $OUT (the device tool's output folder) as text files.
set -euo pipefail
phase=${1:?build or run}
repo=$(pwd)
work=/tmp/moe-native
out=${OUT:-/tmp/moe-native-out}
engines=(llama.cpp ik_llama.cpp)
mkdir -p "$work" "$out"

build() {
  local engine=$1 src="$work/$1" jobs=$2
  mkdir -p "$src" && tar -C "$work" -xJf "$repo/.device/$engine.tar.xz"
  sh "$repo/dockerfiles/llama-cpp-family/build-info.sh" "$src" native-check  # no-op for mainline
  mapfile -t args <"$repo/.device/$engine.cmake-args"
  {
    cmake -S "$src" -B "$src/build" -G Ninja "${args[@]}" &&
    cmake --build "$src/build" --target llama-server llama-bench --parallel "$jobs" &&
    echo ok >"$work/$engine.done"
  } >"$work/$engine.build.log" 2>&1 || echo failed >"$work/$engine.done"
}

if [ "$phase" = build ]; then
  rm -rf "$work"/*.done
  jobs=$(( $(nproc) / 2 ))
  for engine in "${engines[@]}"; do
    setsid bash -c "$(declare -f build); repo=$repo work=$work; build $engine $jobs" </dev/null >/dev/null 2>&1 &
  done
  sleep 560
  for engine in "${engines[@]}"; do echo "== $engine: $(cat "$work/$engine.done" 2>/dev/null || echo building)"; tail -n 2 "$work/$engine.build.log"; done
  exit 0
fi

# ---- run ------------------------------------------------------------------------------------
for _ in $(seq 540); do
  [ -f "$work/llama.cpp.done" ] && [ -f "$work/ik_llama.cpp.done" ] && break
  sleep 1
done
for engine in "${engines[@]}"; do
  cp "$work/$engine.build.log" "$out/$engine.build.log" 2>/dev/null || true
  [ "$(cat "$work/$engine.done" 2>/dev/null)" = ok ] || { echo "$engine build: $(cat "$work/$engine.done" 2>/dev/null || echo unfinished)"; tail -20 "$work/$engine.build.log"; }
done

{
  echo "# host"; nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
  nvcc --version | tail -n 2; gcc --version | head -n 1; nproc
  grep -m1 'model name' /proc/cpuinfo
  echo "amx/avx512 flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(amx|avx512_vnni|avx512_bf16|avx512f)' | tr '\n' ' ')"
} >"$out/facts.txt" 2>&1

python3 -m pip install -q --no-index --no-deps --target "$work/site" "$repo"/.device/whl/*.whl >>"$out/facts.txt" 2>&1
PYTHONPATH="$work/site:$repo" python3 - <<'PY' >>"$out/facts.txt" 2>&1
import pathlib
from builder.models.synth_moe import MoeShape, write_moe_gguf
# Qwen3-30B-A3B expert shapes (hidden 2048, expert FFN 768, 8 of 128 experts used), 8 layers, Q4_0.
shape = MoeShape(layers=8, hidden=2048, heads=32, kv_heads=4, head_dim=128, expert_ffn=768, experts=128,
                 experts_used=8, quant="Q4_0")
path = write_moe_gguf(pathlib.Path("/tmp/moe-native/a3b-8layers-q4_0.gguf"), shape)
print("model", path, path.stat().st_size)
PY

model=$work/a3b-8layers-q4_0.gguf
for engine in "${engines[@]}"; do
  bin="$work/$engine/build/bin"
  [ -x "$bin/llama-server" ] || continue
  {
    echo "# $engine"
    "$bin/llama-server" --version 2>&1 | head -n 3
    echo "vpdpbusd (AVX-512 VNNI): $(objdump -d --no-show-raw-insn "$bin/llama-server" | grep -c vpdpbusd)"
    echo "AMX tile ops (tdpb*): $(objdump -d --no-show-raw-insn "$bin/llama-server" | grep -cE 'tdpb(ssd|f16ps)')"
    echo "sm_90 kernels: $(cuobjdump --list-elf "$bin/llama-server" 2>/dev/null | grep -c sm_90)"
    "$bin/llama-server" --help >"$out/$engine.help.txt" 2>&1 && echo "--help: $(wc -l <"$out/$engine.help.txt") lines"
  } >>"$out/facts.txt" 2>&1
  "$bin/llama-bench" -m "$model" -ngl 99 -ot 'exps=CPU' -t "$(nproc)" -p 512 -n 64 -r 2 -o md \
    >"$out/$engine.bench-experts-on-cpu.md" 2>"$out/$engine.bench.err" || tail -5 "$out/$engine.bench.err"
  "$bin/llama-bench" -m "$model" -ngl 99 -t "$(nproc)" -p 512 -n 64 -r 2 -o md \
    >"$out/$engine.bench-all-gpu.md" 2>>"$out/$engine.bench.err" || tail -5 "$out/$engine.bench.err"
  "$bin/llama-server" -m "$model" -ngl 99 -ot 'exps=CPU' --port 18080 -t "$(nproc)" >"$out/$engine.server.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf localhost:18080/health >/dev/null && break; sleep 1; done
  curl -s localhost:18080/completion -d '{"prompt":"hello expert","n_predict":32,"ignore_eos":true,"temperature":0}' \
    | python3 -c 'import json,sys; r=json.load(sys.stdin); t=r.get("timings",{}); print("completion tokens", r.get("tokens_predicted"), "decode tok/s", t.get("predicted_per_second"), "prompt tok/s", t.get("prompt_per_second"))' \
    >>"$out/facts.txt" 2>&1 || echo "server completion failed" >>"$out/facts.txt"
  kill $pid; wait $pid 2>/dev/null || true
  grep -m3 -E "HAVE_FANCY_SIMD|CUDA0|offloaded" "$out/$engine.server.log" >>"$out/facts.txt" || true
done
cat "$out/facts.txt"; cat "$out"/*.md

#!/usr/bin/env bash
# A CUDA image's own bytes on a GPU machine that has no Docker, run as a container runtime with the
# NVIDIA container toolkit would run it, then measured against a native build of the same engine tree
# and configure arguments, or other ones (prepare's NATIVE_CMAKE_ARGS) (P1 on the GPU path). Needs
# root, unshare and chroot; inputs in .device/ from bench/device/prepare_cuda_image.sh.
#
#   cuda_image.sh           all of it, in one device call of at most ~9 minutes
#   cuda_image.sh start     steps 1-2, keeping what .device/ carried; then, in the next call (within
#   cuda_image.sh run       the machine's warm window), steps 3-5 with the rest of the carried files:
#                           for images whose root filesystem doesn't fit in one call's carry (the
#                           prepare script splits it into .device/rootfs/part-*); calls between them
#   cuda_image.sh carry     only keep what they carry (more parts)
#
#   1. the native build starts in the background (all cores, the image's configure arguments)
#   2. the model the stack was emitted for is written (same name, same shapes: synth_moe.py)
#   3. the image's root filesystem is unpacked; in new mount and PID namespaces it gets /proc, a tmpfs
#      /tmp and /dev/shm, the GPU device nodes, the host driver's user-space libraries and the host's
#      cuBLAS (the one part not carried) bound read-only in, the model directory read-only at /models;
#      the root itself is read-only (the stack's read_only: true); then, as uid 10001 with no
#      capabilities, the image's Config.Env plus the stack's environment, the image's entrypoint runs
#      with the stack's exact command
#   4. the image's health script, then an OpenAI-style completion
#   5. once the native build is done, the native server with the same arguments (another port), and
#      both measured alternately (bench/device/alternate.py)
#
# Results go to $OUT (the device tool's output folder) or /tmp/moe-image-out.
set -uo pipefail
phase=${1:-all}
repo=$(pwd)
work=/tmp/moe-image
dev=$work/carried  # what this call and earlier calls of the same machine carried in .device/
out=${OUT:-/tmp/moe-image-out}
start=$(date +%s)
deadline=$((start + ${BUDGET_S:-540}))
rootfs=$work/rootfs
mkdir -p "$work/models" "$out"
export PYTHONPATH="$work/site:$repo" PYTHONUNBUFFERED=1
say() { echo "[$(($(date +%s) - start))s] $*" | tee -a "$out/run.log"; }
left() { echo $((deadline - $(date +%s))); }
case $phase in all | start) rm -rf "$dev" ;; esac  # a new run: nothing from an earlier image may be mixed in
mkdir -p "$dev/rootfs" && cp -r "$repo"/.device/. "$dev"/
if [ "$phase" = carry ]; then
  say "carried so far: $(find "$dev/rootfs" -name 'part-*' | sort | xargs -r -n1 basename | tr '\n' ' ')"
  exit 0
fi

if [ "$phase" != run ]; then
# ---- 1. native build ----------------------------------------------------------------------------
rm -rf "$work/native" && mkdir -p "$work/native"
tar -C "$work/native" --strip-components=1 -xJf "$dev/engine.tar.xz"
# The image's build step for trees without a build-info generator (ik_llama.cpp's sdist); else a no-op.
sh "$repo/dockerfiles/llama-cpp-family/build-info.sh" "$work/native" "$(cut -d' ' -f2 "$dev/image-id.txt" | sed 's/.*://; s/-cuda.*//')"
native_args=$dev/engine.cmake-args
[ -f "$dev/native.cmake-args" ] && native_args=$dev/native.cmake-args  # prepare's NATIVE_CMAKE_ARGS
mapfile -t cmake_args <"$native_args"
setsid bash -c 'cd "$1" && shift && { cmake -S . -B build -G Ninja "$@" && cmake --build build --target llama-server \
  --parallel "$(nproc)" && echo ok >build.done; } >build.log 2>&1 || echo failed >build.done' _ "$work/native" \
  "${cmake_args[@]}" </dev/null >/dev/null 2>&1 &
say "native build started: ${#cmake_args[@]} configure arguments ($(basename "$native_args")), $(nproc) jobs"

# ---- facts --------------------------------------------------------------------------------------
{
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader
  lscpu | grep -E '^(Model name|CPU\(s\)|Thread|Core)'
  gcc --version | head -1
  nvcc --version | tail -1
} >"$out/facts.txt" 2>&1

# ---- 2. the model ------------------------------------------------------------------------------
python3 -m pip install -q --no-index --no-deps --target "$work/site" "$dev"/whl/*.whl >>"$out/facts.txt" 2>&1
python3 "$repo/bench/device/stack_parts.py" "$dev/stack.yaml" "$work" >>"$out/run.log" 2>&1 || { say "stack.yaml unreadable"; exit 1; }
model_name=$(cat "$work/model-name")
[ -s "$work/models/$model_name" ] || python3 "$repo/bench/device/stack_parts.py" --write-model "$work/models/$model_name" \
  >>"$out/run.log" 2>&1 || { say "the model could not be written"; exit 1; }
say "model $model_name: $(stat -c %s "$work/models/$model_name") bytes"
fi
[ "$phase" = start ] && { say "started; the run phase follows in the next call"; exit 0; }

# ---- 3. the image as a container ---------------------------------------------------------------
model_name=$(cat "$work/model-name")
rm -rf "$rootfs" && mkdir -p "$rootfs"
if [ -f "$dev/image-rootfs.tar.xz" ]; then
  tar -C "$rootfs" --numeric-owner -xJf "$dev/image-rootfs.tar.xz"
else
  say "rootfs from $(find "$dev/rootfs" -name 'part-*' | wc -l) parts"
  cat "$dev"/rootfs/part-* | tar -C "$rootfs" --numeric-owner -xJf - || { say "rootfs parts incomplete"; exit 1; }
fi
lib_dir=/usr/lib/x86_64-linux-gnu
# What the toolkit mounts for NVIDIA_DRIVER_CAPABILITIES=compute,utility (the driver's own files).
driver_libs=()
for soname in libcuda.so.1 libcudadebugger.so.1 libnvidia-nvvm.so.4 libnvidia-ptxjitcompiler.so.1 \
    libnvidia-gpucomp.so libnvidia-ml.so.1; do
  path=$(ldconfig -p | awk -v s="$soname" '$1 == s && /x86-64/ {print $NF; exit}')
  if [ -z "$path" ]; then
    path=$(find /usr/local/nvidia /usr/lib/x86_64-linux-gnu /usr/lib64 -maxdepth 2 -name "${soname%%.so*}.so*" \
      -type f 2>/dev/null | head -1)
  fi
  [ -n "$path" ] && driver_libs+=("$(readlink -f "$path")=$lib_dir/$soname")
done
# cuBLAS and cuBLASLt: the files the carried rootfs left out, bound from the host's copy.
cublas_binds=()
while read -r image_sha _size image_path; do
  name=$(basename "$image_path")
  host="" host_sha=""
  # Every copy of this soname on the host; the one with the image's bytes wins if there is one.
  for candidate in $( (ldconfig -p | awk -v s="$name" '$1 == s {print $NF}'
                       find /usr/local /opt /usr/lib -name "$name" 2>/dev/null) | xargs -r readlink -f | sort -u); do
    sha=$(sha256sum "$candidate" | cut -d' ' -f1)
    if [ -z "$host" ] || [ "$sha" = "$image_sha" ]; then host=$candidate host_sha=$sha; fi
  done
  [ -n "$host" ] || { say "no $name on this host"; exit 1; }
  echo "$name: image sha256 $image_sha; bound from the host's $host, sha256 $host_sha ($([ "$image_sha" = "$host_sha" ] && echo same bytes || echo DIFFERENT bytes))" >>"$out/provenance.txt"
  cublas_binds+=("$host=$image_path")
done <"$dev/image-removed.txt"
printf '%s\n' "${driver_libs[@]}" | sed 's/^/driver: /' >>"$out/provenance.txt"
for bind in "${driver_libs[@]}" "${cublas_binds[@]}"; do mkdir -p "$rootfs$(dirname "${bind#*=}")"; : >"$rootfs${bind#*=}"; done
mkdir -p "$rootfs/proc" "$rootfs/tmp" "$rootfs/dev" "$rootfs/models"
chroot "$rootfs" ldconfig  # the toolkit's hook refreshes the cache for the libraries it adds

cat >"$work/enter.sh" <<'EOF'
#!/bin/bash
# Inside new mount + PID namespaces: build the container's view, then exec the entrypoint as 10001.
set -e
r=$1 models=$2 binds=$3 envfile=$4 argfile=$5
ro() { mount -o remount,bind,ro "$1" || echo "enter.sh: $1 stays writable (no read-only remount here)" >&2; }
mount --bind "$r" "$r"
ro "$r"
mount -t proc proc "$r/proc"
mount -t tmpfs -o size=64m,mode=1777 tmpfs "$r/tmp"
mount -t tmpfs -o mode=755 tmpfs "$r/dev"
for node in null zero full random urandom tty /dev/nvidia*; do
  node=/dev/${node#/dev/}
  [ -c "$node" ] || continue  # character devices only (nvidia-caps/ is MIG's, not needed here)
  : >"$r$node" && mount --bind "$node" "$r$node"
done
mkdir -p "$r/dev/shm" && mount -t tmpfs -o size=1g,mode=1777 shm "$r/dev/shm"
mount --bind "$models" "$r/models" && ro "$r/models"
while IFS= read -r bind; do
  mount --bind "${bind%%=*}" "$r${bind#*=}" && ro "$r${bind#*=}"
done <"$binds"
mapfile -t env_vars <"$envfile"
mapfile -t args <"$argfile"
exec chroot --userspec=10001:10001 "$r" /usr/bin/env -i "${env_vars[@]}" /usr/local/bin/moe-stack-entrypoint "${args[@]}"
EOF
printf '%s\n' "${driver_libs[@]}" "${cublas_binds[@]}" >"$work/binds.txt"
cat "$dev/image-env.txt" "$work/stack-env.txt" >"$work/container-env.txt"
say "rootfs ready: $(du -sh "$rootfs" | cut -f1); ${#driver_libs[@]} driver libraries, ${#cublas_binds[@]} cuBLAS files bound"
timeout "$(left)" unshare --mount --pid --fork --kill-child bash "$work/enter.sh" "$rootfs" "$work/models" \
  "$work/binds.txt" "$work/container-env.txt" "$work/stack-command.txt" >"$work/image-server.log" 2>&1 &
image_pid=$!

# ---- 4. health, then a completion ---------------------------------------------------------------
healthy=no
while [ "$(left)" -gt 60 ] && kill -0 "$image_pid" 2>/dev/null; do
  if chroot --userspec=10001:10001 "$rootfs" /usr/local/bin/moe-stack-health; then healthy=yes; break; fi
  sleep 1
done
say "image: moe-stack-health says healthy=$healthy"
if [ "$healthy" = yes ]; then
  python3 "$repo/bench/device/alternate.py" --complete 8080 >"$out/answer.json" 2>>"$out/run.log"
  say "image: completion $(head -c 300 "$out/answer.json")"
fi

# ---- 5. native server, then both alternately ----------------------------------------------------
while [ ! -f "$work/native/build.done" ] && [ "$(left)" -gt 90 ]; do sleep 2; done
say "native build: $(cat "$work/native/build.done" 2>/dev/null || echo unfinished)"
{ grep -m 3 -A 12 -E 'FAILED|error:|CMake Error' "$work/native/build.log"; tail -n 5 "$work/native/build.log"; } \
  >"$out/native-build-tail.txt" 2>/dev/null
native=$work/native/build/bin/llama-server
if [ "$healthy" = yes ] && [ -x "$native" ]; then
  mapfile -t args <"$work/stack-command.txt"
  for i in "${!args[@]}"; do
    case "${args[$i]}" in
      /models/*) args[i]=$work/models/${args[$i]#/models/} ;;
      8080) args[i]=8081 ;;
    esac
  done
  timeout "$(left)" "$native" "${args[@]}" >"$work/native-server.log" 2>&1 &
  for _ in $(seq 120); do
    python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8081/health", timeout=2)' 2>/dev/null && break
    sleep 1
  done
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >>"$out/facts.txt" 2>&1
  python3 "$repo/bench/device/alternate.py" --ports 8080 8081 --names image native --rounds "${ROUNDS:-12}" \
    -n "${GENERATE:-128}" >"$out/p1.json" 2>>"$out/run.log"
  say "P1: $(tail -n 1 "$out/p1.json")"
fi
for binary in "$rootfs/opt/engine/bin/llama-server" "$native"; do
  [ -x "$binary" ] && echo "$binary: $(cuobjdump --list-elf "$binary" 2>&1 | grep -oE 'sm_[0-9]+' | sort | uniq -c | tr '\n' ' ')" \
    "PTX: $(cuobjdump --list-ptx "$binary" 2>&1 | grep -c '^PTX file'); .nv_fatbin $(size -A "$binary" | awk '$1 == ".nv_fatbin" {print $2}') bytes"
done >>"$out/facts.txt"
pattern='CUDA|ggml_cuda|offload|buffer size|HAVE_|AMX|system_info|override|build:'
grep -a -E "$pattern" "$work/image-server.log" | head -60 >"$out/image-server-log.txt"
grep -a -E "$pattern" "$work/native-server.log" 2>/dev/null | head -60 >"$out/native-server-log.txt"
tail -n 20 "$work/image-server.log" >>"$out/image-server-log.txt"
pkill -f "$work/native/build/bin/llama-server" 2>/dev/null
kill "$image_pid" 2>/dev/null
wait 2>/dev/null
say "done"

#!/usr/bin/env bash
# Where ik_llama.cpp's CUDA device code goes, object by object, and what building it without
# -lineinfo (dockerfiles/llama-cpp-family/cuda-no-lineinfo.sh) takes off it.
# On the GPU machine (it has nvcc and all the cores), with .device/ik-sdist.tar.gz (the pinned sdist)
# and .device/ik.cmake-args (the builder's configure arguments, one per line) carried:
#
#   BUDGET_S=480 bash bench/device/ik_fatbin_sizes.sh
#
# Two trees configure with the same arguments: the sdist as it is, and the same after
# cuda-no-lineinfo.sh. The first tree's CUDA objects build for BUDGET_S seconds (the sample first);
# the second builds only the sample. Writes to $OUT:
#   objects.tsv   object, bytes of its .nv_fatbin (compressed, as linked into llama-server)
#   sample.tsv    object, bytes as the sdist builds it, bytes without -lineinfo
#   trim.log      what cuda-no-lineinfo.sh said
set -uo pipefail
out=${OUT:-/tmp/ik-fatbin-out}
work=/tmp/ik-fatbin
repo=$(pwd)
start=$(date +%s)
budget=${BUDGET_S:-480}
mkdir -p "$out" "$work"
say() { echo "[$(($(date +%s) - start))s] $*" | tee -a "$out/run.log"; }

tar -C "$work" -xzf "$repo/.device/ik-sdist.tar.gz"
whole=$(echo "$work"/ik_llama_cpp_python-*/vendor/ik_llama.cpp)
trimmed=$work/trimmed
cp -a "$whole" "$trimmed"
sh "$repo/dockerfiles/llama-cpp-family/cuda-no-lineinfo.sh" "$trimmed" >"$out/trim.log" 2>&1
for tree in "$whole" "$trimmed"; do
    sh "$repo/dockerfiles/llama-cpp-family/build-info.sh" "$tree" ikpy-0.1.5
done
mapfile -t args <"$repo/.device/ik.cmake-args"
cmake -S "$whole" -B "$work/b-whole" -G Ninja "${args[@]}" >"$out/configure.log" 2>&1 || { say "configure failed"; exit 1; }
cmake -S "$trimmed" -B "$work/b-trim" -G Ninja "${args[@]}" >>"$out/configure.log" 2>&1 || { say "configure failed"; exit 1; }

sample=(mmq-instance-q4_0.cu mmq-instance-iq4_k_id.cu mmq-instance-q8_0_id.cu
    fattn-mma-f16-instance-ncols1_16-ncols2_1.cu fattn-new-mma.cu mmvq-instance-q8_0.cu iqk_mmvq.cu)
objects() {  # the CUDA objects of build dir $1, the sample's first
    local all
    all=$(ninja -C "$1" -t targets all | grep -oE '^[^:]+\.cu\.o' | sort -u)
    for s in "${sample[@]}"; do grep "/$s\.o$" <<<"$all"; done
    [ "${2:-}" = sample ] || grep -vFf <(printf '/%s.o\n' "${sample[@]}") <<<"$all"
}
mapfile -t whole_objs < <(objects "$work/b-whole")
mapfile -t trim_objs < <(objects "$work/b-trim" sample)
say "CUDA objects: ${#whole_objs[@]} in the whole tree; sample ${#trim_objs[@]}; $(nproc) cores"
setsid ninja -C "$work/b-whole" -j "$(nproc)" -k 0 "${whole_objs[@]}" >"$work/whole.log" 2>&1 </dev/null &
setsid ninja -C "$work/b-trim" -j 4 "${trim_objs[@]}" >"$work/trim-build.log" 2>&1 </dev/null &
while [ $(($(date +%s) - start)) -lt "$budget" ]; do
    n=$(find "$work/b-whole" -name '*.cu.o' | wc -l)
    [ "$n" -ge "${#whole_objs[@]}" ] && ! pgrep -x ninja >/dev/null && break
    sleep 10
done
pkill -x ninja; sleep 2
say "built: $(find "$work/b-whole" -name '*.cu.o' | wc -l) of ${#whole_objs[@]}"

fatbin() { size -A "$1" 2>/dev/null | awk '$1 == ".nv_fatbin" { print $2 }'; }
for o in "${whole_objs[@]}"; do
    [ -f "$work/b-whole/$o" ] && printf '%s\t%s\n' "$(basename "$o" .o)" "$(fatbin "$work/b-whole/$o")"
done >"$out/objects.tsv"
for o in "${trim_objs[@]}"; do
    [ -f "$work/b-whole/$o" ] && [ -f "$work/b-trim/$o" ] || continue
    printf '%s\t%s\t%s\n' "$(basename "$o" .o)" "$(fatbin "$work/b-whole/$o")" "$(fatbin "$work/b-trim/$o")"
done >"$out/sample.tsv"
tail -3 "$work/whole.log" >>"$out/run.log"
cat "$out/trim.log" "$out/sample.tsv"
awk -F'\t' '{ n++; s += $2 } END { printf "objects %d, .nv_fatbin total %.1f MB\n", n, s / 1e6 }' "$out/objects.tsv" | tee -a "$out/run.log"

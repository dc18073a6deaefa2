#!/bin/sh
# Write the driver API's link stub: a shared object named libcuda.so.1 that defines every entry
# point cuda.h names (the _v2 versions and the per-thread-stream _ptds/_ptsz variants included), each
# returning CUDA_ERROR_STUB_LIBRARY (34). Programs link against it; at run time the host driver's own
# libcuda.so.1 is loaded instead.
#   make-cuda-stub.sh CUDA_H OUT_SO
set -eu
header=$1 out=$2
work=$(mktemp -d)

{
  grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\(' "$header" | tr -d '( \t'
  sed -nE 's/^[[:space:]]*#[[:space:]]*define[[:space:]]+cu[A-Z][A-Za-z0-9_]*[[:space:]]+(cu[A-Z][A-Za-z0-9_]*)[[:space:]]*$/\1/p' "$header"
  sed -nE 's/.*__CUDA_API_PTDS\((cu[A-Za-z0-9_]+)\).*/\1_ptds/p; s/.*__CUDA_API_PTSZ\((cu[A-Za-z0-9_]+)\).*/\1_ptsz/p' "$header"
} | sort -u >"$work/symbols"

count=$(wc -l <"$work/symbols")
if [ "$count" -lt 400 ]; then
  echo "make-cuda-stub.sh: only $count entry points found in $header; is it cuda.h?" >&2
  exit 1
fi
sed 's/.*/int &(void) { return 34; }/' "$work/symbols" >"$work/stub.c"
mkdir -p "$(dirname "$out")"
gcc -shared -fPIC -O1 -Wl,-soname,libcuda.so.1 -o "$out" "$work/stub.c"
echo "libcuda stub: $count entry points"
rm -rf "$work"

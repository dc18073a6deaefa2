#!/bin/sh
# Lay an unpacked NVIDIA CUDA wheel tree (nvidia/cuXX) out as NVIDIA's images have /usr/local/cuda.
#   cuda-layout.sh WHEEL_ROOT DEVEL_OUT RUNTIME_OUT RUNTIME_LIB...
# The wheels differ from the images in four ways (shared notes, CUDA-FROM-PYPI.md); three are fixed
# here, the fourth (the driver's link stub) by make-cuda-stub.sh.
set -eu
src=$1 devel=$2 runtime=$3
shift 3

mkdir -p "$(dirname "$devel")"
mv "$src" "$devel"
rm -rf "$devel/.metadata"
# 1. The wheels use lib/; CMake and nvcc.profile look in lib64/.
ln -s lib "$devel/lib64"
# 2. Only versioned sonames ship: -lcudart and CMake's find_library need the unversioned names.
for lib in "$devel"/lib/lib*.so.[0-9]*; do
  plain=${lib%%.so.*}.so
  [ -e "$plain" ] || ln -s "$(basename "$lib")" "$plain"
done
# 3. Executables ship mode 0744: let every user run them.
find "$devel/bin" "$devel/nvvm/bin" -type f -perm -u+x -exec chmod 0755 {} +

# The runtime tree: only the libraries a server loads, under their sonames.
mkdir -p "$runtime/lib"
ln -s lib "$runtime/lib64"
for lib in "$@"; do
  cp -a "$devel/lib/$lib" "$runtime/lib/"
done

#!/bin/sh
# Lay NVIDIA's /usr/local/cuda layout over where Debian's packages put the toolkit, as links:
#   cuda-view.sh PREFIX
# bin/ (the compiler's tools), include/, lib64/ (with stubs/libcuda.so) and nvvm/libdevice. Builds
# and tools that look in /usr/local/cuda find the same files apt installed.
set -eu
prefix=$1
triplet=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
mkdir -p "$prefix/bin" "$prefix/nvvm"
for tool in nvcc ptxas fatbinary nvlink cuobjdump nvdisasm cudafe++ bin2c nvprune cu++filt; do
  [ -x "/usr/bin/$tool" ] || { echo "cuda-view.sh: /usr/bin/$tool is missing" >&2; exit 1; }
  ln -s "/usr/bin/$tool" "$prefix/bin/$tool"
done
ln -s /usr/include "$prefix/include"
ln -s "/usr/lib/$triplet" "$prefix/lib64"
ln -s /usr/lib/nvidia-cuda-toolkit/libdevice "$prefix/nvvm/libdevice"
[ -e "$prefix/lib64/stubs/libcuda.so" ] || { echo "cuda-view.sh: no libcuda.so link stub" >&2; exit 1; }

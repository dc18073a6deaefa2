#!/bin/sh
# Build ik_llama.cpp's CUDA kernels without `-lineinfo`. Usage: cuda-no-lineinfo.sh SRC
#
# ik's CMake always adds it (mainline llama.cpp only under GGML_CUDA_DEBUG): source-line tables, for
# profilers, in every kernel. They changed no machine code and were about half of each object's
# compressed device code (a native build's objects, with and without:
# bench/results/ik-cuda-size-2026-12-02). A tree that sets its CUDA flags otherwise is left as it is,
# said in one line, so a build of another ref still succeeds.
set -eu
cmake=$1/ggml/src/CMakeLists.txt
flags='set(CUDA_FLAGS -use_fast_math -extended-lambda'
if grep -qF "$flags -lineinfo)" "$cmake"; then
    sed -i "s/$flags -lineinfo)/$flags)/" "$cmake"
    echo "cuda-no-lineinfo: CUDA kernels built without -lineinfo"
else
    echo "cuda-no-lineinfo: ggml/src/CMakeLists.txt sets CUDA_FLAGS otherwise: kept as it is"
fi

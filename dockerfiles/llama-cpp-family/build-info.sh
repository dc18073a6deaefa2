#!/bin/sh
# Supply build info to trees without a .git to read it from: ik_llama.cpp's sdists ship
# common/build-info.cpp.in but not the common/cmake/build-info-gen-cpp.cmake script the build runs
# to fill it, and a mirror's tarball (git archive) ships the script, which asks git and finds
# nothing ("unknown"). Write that script, filling in the pinned ref and the compiler cmake reports.
# Usage: build-info.sh SRC REF
set -eu
src=$1
ref=$2
script="$src/common/cmake/build-info-gen-cpp.cmake"
if [ -d "$src/.git" ] || [ ! -f "$src/common/build-info.cpp.in" ]; then
    exit 0  # the tree's own generator reads git, or the tree needs none
fi
mkdir -p "$(dirname "$script")"
cat >"$script" <<CMAKE
# Written by moe-stack: this tree shipped without its build-info generator.
set(BUILD_NUMBER 0)
set(BUILD_COMMIT "$ref")
set(BUILD_COMPILER "\${CMAKE_C_COMPILER_ID} \${CMAKE_C_COMPILER_VERSION}")
set(BUILD_TARGET "$(cc -dumpmachine)")
configure_file("\${CMAKE_CURRENT_LIST_DIR}/../build-info.cpp.in" "\${CMAKE_CURRENT_LIST_DIR}/../build-info.cpp" @ONLY)
CMAKE

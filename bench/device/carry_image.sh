#!/usr/bin/env bash
# A built image for the device harness's ENGINE@NAME+image tree (bench/device/harness.py): its root
# filesystem as `docker export` gives it, xz-compressed in parts of 40 MiB (a device call carries 64 MiB
# with the checkout), with what a runtime starts it with. Here, where Docker has the image:
#
#   bash bench/device/carry_image.sh IMAGE TREE     e.g. ghcr.io/moe-stack/llama-cpp:0c1e57098-cuda13.0-
#                                                   sapphirerapids llama.cpp@cuda13.0-sapphirerapids+image
#
# writes .device/seed/TREE/: rootfs.tar.xz.part-aa, -ab, ... and rootfs.sha256 (the whole archive's);
# env.txt (the image's Config.Env); flags.json (its server's flag contract, the label); removed.txt (`sha256 bytes /path` a line: a CUDA 13 image's cuBLAS and
# cuBLASLt, ~600 MB, left out: the GPU machine binds its own copy of the same release, from NVIDIA's
# wheels; a CUDA 12 image keeps them, that machine has none). XZ_LEVEL (default -9e; -6: faster).
# Carry the folder's small files and the parts over as many calls as they take: the harness gathers
# them on the machine and enters the image once they are whole.
set -euo pipefail
image=${1:?IMAGE} tree=${2:?TREE, e.g. llama.cpp@NAME+image}
out=$(cd "$(dirname "$0")/../.." && pwd)/.device/seed/$tree
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/rootfs"
container=$(docker create "$image")
docker export "$container" | tar -C "$work/rootfs" -xf -
docker rm "$container" >/dev/null
rm -rf "$out" && mkdir -p "$out"
: >"$out/removed.txt"
if [ "$(docker image inspect -f '{{index .Config.Labels "io.moe-stack.cuda"}}' "$image" | cut -d. -f1)" = 13 ]; then
  for path in $(cd "$work/rootfs" && find usr/local usr/lib -type f \( -name libcublas.so.13 -o -name libcublasLt.so.13 \)); do
    echo "$(sha256sum "$work/rootfs/$path" | cut -d' ' -f1) $(stat -c %s "$work/rootfs/$path") /$path" >>"$out/removed.txt"
    rm "$work/rootfs/$path"
  done
fi
tar -C "$work/rootfs" --numeric-owner -cf - . | xz -T0 "${XZ_LEVEL:--9e}" | split -b 40M - "$out/rootfs.tar.xz.part-"
cat "$out"/rootfs.tar.xz.part-* | sha256sum | cut -d' ' -f1 >"$out/rootfs.sha256"
docker image inspect -f '{{range .Config.Env}}{{println .}}{{end}}' "$image" | sed '/^$/d' >"$out/env.txt"
docker image inspect -f '{{index .Config.Labels "io.moe-stack.server-flags"}}' "$image" >"$out/flags.json"
du -sh "$out"/* | sort -h

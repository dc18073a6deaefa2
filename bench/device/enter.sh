#!/bin/bash
# An image's root filesystem entered as a container runtime enters it (bench/device/machine.py's
# Tree.enter runs this in new mount and PID namespaces): the root read-only, /proc, a tmpfs /tmp and
# /dev/shm, the device nodes (the GPU's among them), the model directory read-only at /models, the
# host files of BINDS (HOST=PATH a line: the driver's libraries, what the carry left out) read-only;
# then, as uid 10001 with no capabilities, only the ENV file's variables, the image's entrypoint with
# the ARGS file's arguments (one a line).
# Usage: enter.sh ROOTFS MODELS BINDS ENV ARGS
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

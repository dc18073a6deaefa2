#!/usr/bin/env bash
# Get a host ready for moe-stack: a Docker engine with buildx and compose (installed and started from
# Debian when none answers and we are root), debootstrap (for `moe-stack base` where no registry is
# reachable), and the project in .venv. Usage: prepare-host.sh [EXTRAS], e.g. `test`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! docker info >/dev/null 2>&1 || ! docker buildx version >/dev/null 2>&1 \
    || ! docker compose version >/dev/null 2>&1; then
  bash scripts/install-docker.sh
fi
if ! command -v debootstrap >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".${1:+[$1]}"

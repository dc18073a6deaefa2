#!/usr/bin/env bash
# Bring up the demo stack: llama.cpp CPU image + Gemma 3 270M, answering on http://127.0.0.1:8080.
# On a fresh Debian host, run as root (installs Docker if missing). Options go to `moe-stack demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prepare-host.sh
exec .venv/bin/moe-stack demo "$@"

#!/usr/bin/env bash
# Run moe-stack's whole test suite: unit tests, then real Docker builds of both engines and real
# stacks answering over HTTP. On a fresh Debian host, run as root (installs Docker if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prepare-host.sh test
exec .venv/bin/python -m pytest "$@"

#!/usr/bin/env bash
# Get a host ready for moe-stack: a Docker engine with buildx and compose (installed and started from
# Debian when none answers and we are root), debootstrap (for `moe-stack base` where no registry is
# reachable), npm (the chat page mainline's image embeds), and the project in .venv. Usage:
# prepare-host.sh [EXTRAS], e.g. `test`; the tests also get Debian's docker-registry (distribution v2),
# which they start on 127.0.0.1 themselves, and Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! docker info >/dev/null 2>&1 || ! docker buildx version >/dev/null 2>&1 \
    || ! docker compose version >/dev/null 2>&1; then
  bash scripts/install-docker.sh
fi
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v npm >/dev/null || missing+=(npm)  # builds mainline's chat page (builder/images/chat_page.py)
if [ "${1:-}" = test ] && ! command -v docker-registry >/dev/null; then missing+=(docker-registry); fi
# The chat page's browser test drives Debian's Chromium (Playwright's own browser download needs a network).
if [ "${1:-}" = test ] && ! command -v chromium >/dev/null; then missing+=(chromium); fi
if [ "${#missing[@]}" -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  # A policy-rc.d of our own (where there is none): the package must not start a registry on :5000.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d && own_policy=1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  if [ "$own_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
fi

python3 -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".${1:+[$1]}"

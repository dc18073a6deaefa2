#!/usr/bin/env bash
# Install and start a Docker engine (26.x, compose v2, buildx) from Debian trixie without adding
# trixie to the system's apt sources: apt reads a one-line list of its own (see DESIGN.md).
set -euo pipefail

log=/var/log/dockerd.log

if ! command -v dockerd >/dev/null || ! docker compose version >/dev/null 2>&1 \
    || ! docker buildx version >/dev/null 2>&1; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  work=$(mktemp -d)
  mkdir -p "$work/lists/partial"
  echo "deb $mirror trixie main" >"$work/trixie.list"
  opts=(-o "Dir::Etc::sourcelist=$work/trixie.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$work/lists")
  apt-get "${opts[@]}" update -qq
  DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y -qq --no-install-recommends \
    docker.io docker-cli docker-compose docker-buildx containerd runc tini >/dev/null
  rm -rf "$work"
fi

if ! docker info >/dev/null 2>&1; then
  setsid dockerd >"$log" 2>&1 </dev/null &
  for _ in $(seq 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
fi
docker info --format 'docker {{.ServerVersion}} ({{.Driver}})' || { tail -20 "$log"; exit 1; }
docker compose version
docker buildx version

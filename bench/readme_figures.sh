#!/usr/bin/env bash
# The README's first two commands timed as a newcomer runs them, in its order: the demo, then the tests
# beside it (the demo keeps serving on 8080 all along, and must still answer at the end). With COLD=1 the
# Docker store and moe-stack's cache are emptied first (pip's cache kept): that destroys every image and
# container on the host, so it is asked for by name. COLD=isolated measures the same cold start on a
# throwaway daemon and cache beside the host's (bench/isolated_docker.sh), leaving the host as it was.
# Writes bench/results/readme-figures-<date>/figures.json, for the README to quote. Needs a quiet machine:
# anything else running on the 2 cores stretches both figures; NEIGHBOUR=N runs N CPU-bound loops beside
# the whole run on purpose (a busy host, issue 62), and TESTS=0 times the demo alone.
#
#   sudo COLD=1 bash bench/readme_figures.sh
#   sudo COLD=isolated bash bench/readme_figures.sh
#   sudo COLD=isolated NEIGHBOUR=2 TESTS=0 bash bench/readme_figures.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results/readme-figures-$(date -u +%Y-%m-%d)
mkdir -p "$out"
if [ "${COLD:-0}" = 1 ]; then
  docker ps -aq | xargs -r docker rm -f >/dev/null
  docker system prune -af --volumes >/dev/null
  docker builder prune -af >/dev/null
  rm -rf "${XDG_CACHE_HOME:-$HOME/.cache}/moe-stack"
elif [ "${COLD:-0}" = isolated ]; then
  scratch=$(mktemp -d /var/tmp/moe-stack-cold.XXXXXX)
  trap 'bash bench/isolated_docker.sh stop "$scratch"' EXIT
  DOCKER_HOST=$(bash bench/isolated_docker.sh start "$scratch")
  export DOCKER_HOST PIP_CACHE_DIR="${PIP_CACHE_DIR:-$HOME/.cache/pip}" XDG_CACHE_HOME="$scratch/cache"
fi
neighbours=()
for _ in $(seq "${NEIGHBOUR:-0}"); do
  setsid sh -c 'while :; do :; done' & neighbours+=("$!")
done
[ "${#neighbours[@]}" -eq 0 ] || trap 'kill "${neighbours[@]}"; ${scratch:+bash bench/isolated_docker.sh stop "$scratch"}' EXIT
uptime >"$out/uptime-before.txt"
started=$(date +%s)
bash scripts/demo.sh >"$out/demo.log" 2>&1
demo_s=$(( $(date +%s) - started ))
uptime >"$out/uptime-after-demo.txt"
started=$(date +%s)
status=0 summary="not run (TESTS=0)"
if [ "${TESTS:-1}" != 0 ]; then
  bash scripts/test.sh -q -p no:cacheprovider >"$out/tests.log" 2>&1 || status=$?
  summary=$(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$out/tests.log" | tail -n 1)
fi
tests_s=$(( $(date +%s) - started ))
demo_up=false
if curl -fsS http://127.0.0.1:8080/health >/dev/null; then demo_up=true; fi
cat >"$out/figures.json" <<JSON
{"date": "$(date -u +%Y-%m-%d)", "cold": "${COLD:-0}", "cores": $(nproc), "neighbours": ${NEIGHBOUR:-0},
 "demo_seconds": $demo_s, "demo_minutes": $(( (demo_s + 30) / 60 )),
 "tests_minutes": $(( (tests_s + 30) / 60 )), "tests_exit": $status, "tests_summary": "$summary",
 "demo_still_serving": $demo_up}
JSON
cat "$out/figures.json"

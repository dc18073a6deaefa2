#!/usr/bin/env bash
# Run moe-stack's whole test suite by cost, each tier timed: the pure unit tests, the command line in a
# subprocess, the linters (and the suite run again in a copy), then real Docker builds of both engines and
# real stacks answering over HTTP (the `slow` ones, images built only to prove a target's instructions, with
# MOE_STACK_SLOW=1: CI runs them nightly). Every tier runs (a failing one doesn't hide the next); the exit status
# is the first failure's, and the last line counts them all. Options (-v, -x, -k ...) go to each pytest.
# On a fresh Debian host, run as root (installs Docker if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/prepare-host.sh test
tiers=(
  "unit|tests/unit|not cli and not lint"
  "cli|tests/unit|cli"
  "lint|tests/unit|lint"
  "integration|tests/integration|$([ "${MOE_STACK_SLOW:-0}" = 1 ] || echo 'not slow')"
)
count() {  # the tier's count of `$1` in its summary line
  { grep -oE "[0-9]+ ($1)" <<<"$summary" || true; } | awk '{n += $1} END {print n + 0}'
}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0 passed=0 failed=0 times=()
for tier in "${tiers[@]}"; do
  IFS='|' read -r name path marker <<<"$tier"
  started=$(date +%s)
  rc=0
  .venv/bin/python -m pytest "$path" ${marker:+-m "$marker"} "$@" 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
  [ "$rc" -eq 5 ] && rc=0  # a tier the options left empty
  [ "$status" -ne 0 ] || status=$rc
  summary=$({ grep -E '(passed|failed|errors?|skipped|deselected|no tests ran).* in [0-9.]+s' "$log" || true; } | tail -n 1)
  passed=$(( passed + $(count passed) ))
  failed=$(( failed + $(count 'failed|errors?') ))
  times+=("$name $(( $(date +%s) - started )) s")
done
printf 'tiers:'; printf ' %s;' "${times[@]}"; echo
echo "$passed passed, $failed failed"
exit "$status"

#!/usr/bin/env bash
# Run moe-stack's whole test suite by cost, each tier timed: the pure unit tests, the command line in a
# subprocess, the linters (and the suite run again in a copy), then real Docker builds of both engines and
# real stacks answering over HTTP (the `slow` ones, images built only to prove a target's instructions and
# one engine's minutes-long case, with MOE_STACK_SLOW=1: CI runs them nightly). Every tier runs (a failing one doesn't hide the next); the exit status
# is the first failure's, and the last line counts them all: passed, failed (errors included), skipped, and
# deselected: the tests no tier ran (the unit tiers split tests/unit by marker between them, so what one
# leaves out another runs; the integration tier leaves out the `slow` ones). Options (-v, -x, -k ...) go to
# each pytest.
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
status=0 passed=0 failed=0 skipped=0 times=()
declare -A collected ran  # by path: the tests its tiers collected, and those they ran
for tier in "${tiers[@]}"; do
  IFS='|' read -r name path marker <<<"$tier"
  started=$(date +%s)
  rc=0
  .venv/bin/python -m pytest "$path" ${marker:+-m "$marker"} "$@" 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
  [ "$rc" -eq 5 ] && rc=0  # a tier the options left empty
  [ "$status" -ne 0 ] || status=$rc
  summary=$({ grep -E '(passed|failed|errors?|skipped|deselected|no tests ran).* in [0-9.]+s' "$log" || true; } | tail -n 1)
  tier_ran=$(( $(count passed) + $(count 'failed|errors?') + $(count skipped) ))
  passed=$(( passed + $(count passed) ))
  failed=$(( failed + $(count 'failed|errors?') ))
  skipped=$(( skipped + $(count skipped) ))
  collected[$path]=$(( tier_ran + $(count deselected) ))
  ran[$path]=$(( ${ran[$path]:-0} + tier_ran ))
  times+=("$name $(( $(date +%s) - started )) s")
done
printf 'tiers:'; printf ' %s;' "${times[@]}"; echo
deselected=0
for path in "${!collected[@]}"; do deselected=$(( deselected + collected[$path] - ran[$path] )); done
echo "$passed passed, $failed failed, $skipped skipped, $deselected deselected"
exit "$status"

#!/usr/bin/env bash
# One row of the image matrix (`moe-stack matrix --json --set default|all`), built and pushed: the server
# image, then its tools image where the row says so; each pushed tag checked against the registry (the
# build prints `pushed TAG DIGEST` once the registry serves that digest); the digests listed in $PUSHED
# for signing. .github/workflows/images.yml runs this for every row, and the test suite runs it end to
# end against a local registry (tests/integration/test_publish_workflow.py), so a broken step is red
# there before a real run.
#
# The row:     ENGINE CUDA (none or X.Y) CUDA_ARCHS (comma-separated) CPU TOOLS (true/false)
# Where:       REGISTRY NAMESPACE, PUSHED (the file the digests go to)
# Optional:    CACHE_REPO    the registry cache (every stage, mode=max) at CACHE_REPO:<variant>
#              ATTEST=false  no SBOM or provenance (the docker driver, the suite's dry run, has none)
#              REF CHANNEL   another ref than the pinned one, the moving alias' prefix (edge.yml)
#              SOURCE BASE_IMAGE  another engine tree and base image than the pinned ref's clone and
#                            the default bases (the suite: PyPI's sdist, a local Debian base)
#              COMPILE_CACHE a directory the compile cache (ccache) is carried through, in and out: only
#                            one that no less trusted job can write (never GitHub's Actions cache, which
#                            any job on the branch can; images.yml passes none)
set -euo pipefail
: "${ENGINE:?}" "${CUDA:?}" "${CPU:?}" "${TOOLS:?}" "${REGISTRY:?}" "${NAMESPACE:?}" "${PUSHED:?}"

args=(--engine "$ENGINE" --cpu "$CPU" --registry "$REGISTRY" --namespace "$NAMESPACE" --push)
if [ "$CUDA" != none ]; then args+=(--cuda "$CUDA" --cuda-archs "${CUDA_ARCHS:?}"); fi
if [ -n "${CACHE_REPO:-}" ]; then args+=(--registry-cache "$CACHE_REPO"); fi
if [ "${ATTEST:-true}" = false ]; then args+=(--no-attest); fi
if [ -n "${REF:-}" ]; then args+=(--ref "$REF"); fi
if [ -n "${CHANNEL:-}" ]; then args+=(--channel "$CHANNEL"); fi
if [ -n "${SOURCE:-}" ]; then args+=(--source "$SOURCE"); fi
if [ -n "${BASE_IMAGE:-}" ]; then args+=(--base-image "$BASE_IMAGE"); fi
if [ -n "${COMPILE_CACHE:-}" ]; then args+=(--ccache-dir "$COMPILE_CACHE"); fi

flavors=(server)
if [ "$TOOLS" = true ]; then flavors+=(tools); fi
: >"$PUSHED"
for flavor in "${flavors[@]}"; do
  flavor_args=()
  if [ "$flavor" = tools ]; then flavor_args=(--tools); fi
  printed=$(moe-stack build "${args[@]}" "${flavor_args[@]}" --progress plain)
  printf '%s\n' "$printed"
  # `pushed REGISTRY/NAMESPACE/IMAGE:TAG sha256:…`: the tag and its moving alias share the digest.
  awk '$1 == "pushed" { ref = $2; sub(/:[^:\/]*$/, "", ref); print ref "@" $3 }' <<<"$printed" |
    sort -u >>"$PUSHED"
done
[ -s "$PUSHED" ] || { echo "publish-variant: the build printed no pushed digest" >&2; exit 1; }

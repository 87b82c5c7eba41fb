#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, builds (or reuses) the local
# control plane, then runs lint, type checks, unit tests, the e2e tests against the control plane
# and the real-TensorFlow trainer tests. Exits non-zero on any failure, including "no tests ran".
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n=== %s\n' "$*" >&2; }

log "installing system tools the tests use (iproute2 for the TensorFlow network namespaces, curl)"
if ! command -v ip >/dev/null || ! command -v curl >/dev/null; then
  apt-get update -qq && apt-get install -y -qq iproute2 curl >/dev/null
fi

log "installing the operator, the trainer runtime and the dev tools"
python3 -m pip install --quiet --disable-pip-version-check -e '.[operator,dev]' -e images/trainer

log "lint and types"
ruff check .
ruff format --check .
mypy
hadolint Dockerfile images/trainer/Dockerfile

log "building or reusing the local control plane (a cold build takes a while on 2 cores)"
e2e/cluster/cluster.sh build

log "tests"
status=0
python3 -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$status"

#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs what it needs, builds (or reuses) the local
# control plane, kind and its node image, and the images, then runs lint, type checks, the docs
# site, unit tests, the e2e tests against the control plane (KWOK nodes), then on a kind cluster of
# three nodes (real kubelets), and the real-TensorFlow trainer tests. Prints a timing table. Exits non-zero on any failure, including
# "no tests ran".
set -euo pipefail
cd "$(dirname "$0")/.."
. e2e/packages.sh
. e2e/venv.sh

STEPS=()
step() {  # name command...: runs a step and records how long it took
  local name=$1 start=$SECONDS status=0; shift
  printf '\n=== %s\n' "$name" >&2
  "$@" || status=$?
  STEPS+=("$(printf '%-58s %5ds' "$name" $((SECONDS - start)))")
  return "$status"
}
timings() {
  printf '\n=== timings (wall clock)\n' >&2
  printf '%s\n' "${STEPS[@]}" "$(printf '%-58s %5ds' total "$SECONDS")" >&2
}
trap timings EXIT

# All at once, so that their time shows in the table (the scripts below install what they use, for
# the demo): iproute2: network namespaces of the TensorFlow tests; docker.io (dockerd, containerd,
# runc): image builds and kind's nodes; jq: runc-without-sys-resource; mmdebstrap: the images' and
# the kind node's bases; gcc and libc6-dev: the pause image; python3-venv: the virtual environment;
# g++, make and libcurl4-openssl-dev: the trainer's s3:// filesystem plugin, which the TensorFlow
# tests build (images/trainer/s3fs).
system_packages() {
  need_packages iproute2 docker.io jq mmdebstrap gcc libc6-dev python3-venv g++ make libcurl4-openssl-dev
}

python_packages() {  # into the project's virtual environment (e2e/venv.sh), put first on PATH
  project_venv -e '.[operator,dev,docs]' -e images/trainer
}

# Chained: a step's function runs where `set -e` does not apply (step's `||`), so each command's
# failure must end it.
lint() {
  ruff check . &&
  ruff format --check . &&
  mypy &&
  docs_site &&
  hadolint Dockerfile images/trainer/Dockerfile images/tensorflow/Dockerfile images/kueue/Dockerfile \
    images/seaweedfs/Dockerfile examples/plain-tf/Dockerfile examples/own-code/Dockerfile \
    e2e/cluster/kind/node.Dockerfile e2e/cluster/kind/component.Dockerfile
}

# The documentation site, built where the checkout is not: a broken link, a missing anchor or a page
# left out of mkdocs.yml's navigation fails it (strict). The generated reference pages are checked
# against the code by tests/unit/test_reference_docs.py.
docs_site() {
  NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet --site-dir "${TMPDIR:-/tmp}/psoperator-site"
}

run_pytest() {  # ARGS...: pytest, failing on failures and on "no tests ran"
  local status=0
  python -m pytest --durations=20 "$@" || status=$?
  if [ "$status" -eq 5 ]; then
    echo "pytest $*: collected no tests: that is a failure" >&2
    return 1
  fi
  return "$status"
}

# With arguments, one pytest of them. Without, two at once, each with its own cluster: e2e/real on
# kind (it mostly waits: on TensorFlow pods, kubelets and kind's controllers) beside the rest
# (tests/unit, e2e on the local control plane's KWOK nodes, tests/trainer). e2e/real's output is
# printed when it ends, and is in its log meanwhile.
pytest_all() {
  [ $# -gt 0 ] && { run_pytest "$@"; return; }
  local dir="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}/real" pid real=0 rest=0
  local log="$dir/logs/pytest.log"
  mkdir -p "$dir/logs"
  echo "e2e/real runs beside the other tests; its output: $log" >&2
  # Its own base for tmp_path: each pytest removes old ones of its base.
  run_pytest --basetemp="$dir/pytest" e2e/real >"$log" 2>&1 &
  pid=$!
  run_pytest --ignore=e2e/real || rest=$?
  wait "$pid" || real=$?
  printf '\n=== e2e/real (exit %d)\n' "$real" >&2
  cat "$log"
  [ "$real" -eq 0 ] && [ "$rest" -eq 0 ]
}

step "system packages (apt)" system_packages
step "Python packages (uv)" python_packages
step "lint, types and the docs site" lint
step "binaries: control plane, CoreDNS, kube-router, helm, prometheus, kind, kubeadm" e2e/cluster/cluster.sh build
step "kind node image (mmdebstrap, component images)" e2e/cluster/kindnode.sh
step "images: base (mmdebstrap), operator, trainer" images/build.sh
step "Kueue: its manager (Go) and image" images/build.sh kueue
step "SeaweedFS (the S3 store of the s3:// tests): its weed (Go) and image" images/build.sh seaweedfs
step "tests (pytest)" pytest_all "$@"

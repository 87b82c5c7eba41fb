#!/usr/bin/env bash
# The README's main command: on a fresh machine, build (first run only) Kubernetes, kind and a kind
# node image, bring up a kind cluster of three nodes, build both images from the repository's
# Dockerfiles, install the operator with Helm (in-cluster, under the chart's ServiceAccount and Pod
# Security `restricted`), apply the example job and watch it train to Succeeded.
#
#   e2e/demo.sh          bring everything up and train the example (the cluster stays up)
#   e2e/demo.sh down     take the cluster down
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}"
export PATH="$CACHE/bin:$PATH"
NS=psoperator-system
RELEASE=psoperator
JOB_NS=default
OPERATOR_IMAGE=ps-training-operator:dev
TRAINER_IMAGE=ps-training-operator/trainer:dev
STEPS="${PSOPERATOR_DEMO_STEPS:-2000}"

log() { printf '[demo %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ "${1:-}" = "down" ]; then
  exec e2e/cluster/kind.sh down
fi

log "the project's virtual environment (.venv): the base package, which shapes the example's manifests for this machine"
. e2e/packages.sh
. e2e/venv.sh
project_venv -e . -e images/trainer

log "starting the kind cluster (the first run builds Kubernetes, kind and its node image from source)"
KUBECONFIG="$(e2e/cluster/kind.sh up)"
export KUBECONFIG
kubectl get nodes -o wide

log "building the images from Dockerfile and images/trainer/Dockerfile, loading them into the nodes"
images/build.sh
e2e/cluster/kind.sh load "$OPERATOR_IMAGE" "$TRAINER_IMAGE"

log "installing the chart: the operator runs in-cluster from $OPERATOR_IMAGE"
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl label --overwrite namespace "$NS" pod-security.kubernetes.io/enforce=restricted >/dev/null
# Helm installs crds/ once and never upgrades it: the CRD first, as an upgrade does (docs/how-to/upgrade.md).
kubectl apply --server-side --force-conflicts -f charts/ps-training-operator/crds >/dev/null
helm upgrade --install "$RELEASE" charts/ps-training-operator --namespace "$NS" \
  --set image.repository="${OPERATOR_IMAGE%:*}" --set image.tag="${OPERATOR_IMAGE##*:}" \
  --set image.pullPolicy=Never --wait --timeout 3m
kubectl get deployment,pods -n "$NS"

log "applying examples/ctr-job.yaml ($STEPS steps, 2-core sizes, checkpoints on a hostPath volume every node mounts)"
kubectl delete psjob ctr -n "$JOB_NS" --ignore-not-found --wait >/dev/null
kubectl delete pv "$JOB_NS-ctr-checkpoints" --ignore-not-found --wait >/dev/null
rm -rf "$CACHE/real/volumes/$JOB_NS"
python -m e2e.real.example --namespace "$JOB_NS" --steps "$STEPS" | kubectl apply -n "$JOB_NS" -f -

log "training (kubectl get psjob every 15 s until it ends)"
for _ in $(seq 120); do
  kubectl get psjob ctr -n "$JOB_NS" --no-headers
  phase="$(kubectl get psjob ctr -n "$JOB_NS" -o jsonpath='{.status.phase}')"
  case "$phase" in Succeeded|Failed) break ;; esac
  sleep 15
done
echo
kubectl get psjob ctr -n "$JOB_NS"
kubectl get psjob ctr -n "$JOB_NS" \
  -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}): {.message}{"\n"}{end}'
[ "$phase" = Succeeded ]

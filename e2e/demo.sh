#!/usr/bin/env bash
# The README's main command: on a fresh machine, build (first run only) and start the local control
# plane with simulated CPU and GPU nodes, install the operator with Helm, run it, apply the example
# job and show it Running.
#
# This machine has no container runtime, so the chart's Deployment is installed with 0 replicas and
# the operator runs here as a process, under the chart's ServiceAccount (a token from the
# TokenRequest API): the RBAC the chart grants is exactly what it runs with.
#
#   e2e/demo.sh          bring everything up, show the job, stop the operator (the cluster stays)
#   e2e/demo.sh down     take the cluster down
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
CACHE="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}"
export PATH="$CACHE/bin:$PATH"
NS=psoperator-system
RELEASE=psoperator
JOB_NS=default

log() { printf '[demo %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ "${1:-}" = "down" ]; then
  exec e2e/cluster/cluster.sh down
fi

log "installing the operator's Python package"
python3 -m pip install --quiet --disable-pip-version-check -e '.[operator]'

log "starting the local control plane (the first run builds Kubernetes from source: tens of minutes)"
KUBECONFIG="$(e2e/cluster/cluster.sh up)"
export KUBECONFIG
kubectl get nodes -L psoperator.io/pool -L nvidia.com/gpu.present

log "installing the chart (CRD, RBAC, ServiceAccount; Deployment scaled to 0 here)"
helm upgrade --install "$RELEASE" charts/ps-training-operator --namespace "$NS" --create-namespace \
  --set replicaCount=0 --wait --timeout 2m
kubectl wait --for condition=Established crd/pstrainingjobs.psoperator.io --timeout 60s

SA="$(kubectl get serviceaccount -n "$NS" -l app.kubernetes.io/instance="$RELEASE" -o jsonpath='{.items[0].metadata.name}')"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
SERVER="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
CA_FILE="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')"
if [ -n "$CA_FILE" ]; then
  cp "$CA_FILE" "$WORK/ca.crt"
else
  kubectl config view --minify --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d > "$WORK/ca.crt"
fi
kubectl create token "$SA" -n "$NS" --duration 1h > "$WORK/token"
cat > "$WORK/operator.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$SERVER", certificate-authority: "$WORK/ca.crt"}}]
users: [{name: $SA, user: {tokenFile: "$WORK/token"}}]
contexts: [{name: operator, context: {cluster: local, user: $SA}}]
current-context: operator
EOF

log "running the operator as ServiceAccount $NS/$SA (log: $CACHE/demo-operator.log)"
KUBECONFIG="$WORK/operator.kubeconfig" python3 -m psoperator run --all-namespaces --standalone \
  --liveness http://127.0.0.1:18080/healthz > "$CACHE/demo-operator.log" 2>&1 &
OPERATOR=$!
trap 'kill $OPERATOR 2>/dev/null; wait $OPERATOR 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 60); do
  curl -fsS http://127.0.0.1:18080/healthz >/dev/null 2>&1 && break
  kill -0 "$OPERATOR" 2>/dev/null || { cat "$CACHE/demo-operator.log"; exit 1; }
  sleep 1
done

log "applying examples/ctr-job.yaml"
kubectl apply -n "$JOB_NS" -f "$REPO/examples/ctr-job.yaml"
kubectl wait -n "$JOB_NS" psjob/ctr --for jsonpath='{.status.phase}'=Running --timeout 120s

kubectl get psjob -n "$JOB_NS"
echo
kubectl get pods,statefulsets,jobs,services -n "$JOB_NS" -l psoperator.io/job-name=ctr -o wide
echo
kubectl get psjob ctr -n "$JOB_NS" \
  -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}): {.message}{"\n"}{end}'
echo
log "done. The cluster stays up: KUBECONFIG=$KUBECONFIG; take it down with: e2e/demo.sh down"

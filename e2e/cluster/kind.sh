#!/usr/bin/env bash
# The e2e cluster on a machine with Docker: kind with a CPU worker and a GPU-pool worker (label,
# taint and an advertised nvidia.com/gpu extended resource, no real GPU), so the same tests run
# against real kubelets. The `kubelet` tests run here; the KWOK-only chaos tests skip.
#
#   kind.sh up [IMAGE...]   create the cluster (if missing), load the images, print the kubeconfig path
#   kind.sh down            delete it
#
#   KUBECONFIG=$(e2e/cluster/kind.sh up psoperator:dev) python -m pytest e2e
set -euo pipefail

NAME="${PSOPERATOR_CLUSTER:-psoperator}"
CACHE="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}"
KUBECONFIG_PATH="$CACHE/kind-$NAME.kubeconfig"
GPUS_PER_NODE=4

log() { printf '[kind %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
kctl() { kubectl --kubeconfig "$KUBECONFIG_PATH" "$@"; }

up() {
  mkdir -p "$CACHE"
  if ! kind get clusters 2>/dev/null | grep -qx "$NAME"; then
    log "creating kind cluster $NAME"
    kind create cluster --name "$NAME" --kubeconfig "$KUBECONFIG_PATH" --wait 180s \
      ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --config - >&2 <<'EOF'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
- role: worker
  labels:
    psoperator.io/pool: cpu
- role: worker
  labels:
    psoperator.io/pool: gpu
    nvidia.com/gpu.present: "true"
EOF
  fi
  kind get kubeconfig --name "$NAME" > "$KUBECONFIG_PATH"
  local node
  for node in $(kctl get nodes -l nvidia.com/gpu.present=true -o name); do
    kctl taint --overwrite "$node" nvidia.com/gpu=present:NoSchedule >&2
    # An extended resource advertised on the node status is kept by the kubelet and scheduled on.
    kctl patch "$node" --subresource=status --type=merge \
      -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$GPUS_PER_NODE\"}}}" >&2
  done
  if [ $# -gt 0 ]; then
    log "loading images: $*"
    kind load docker-image --name "$NAME" "$@" >&2
  fi
  echo "$KUBECONFIG_PATH"
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) kind delete cluster --name "$NAME" >&2; rm -f "$KUBECONFIG_PATH" ;;
  *) echo "usage: $0 up [IMAGE...] | down" >&2; exit 2 ;;
esac

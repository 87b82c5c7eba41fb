#!/usr/bin/env bash
# The real-container e2e cluster: kind, with a control plane, a CPU worker and a GPU-pool worker
# (label, taint and an advertised nvidia.com/gpu extended resource, no real GPU), so that a job's
# PS and chief run on one node and its GPU workers on another: DNS and gRPC between them cross nodes.
#
#   kind.sh up                create the cluster (if missing); prints the kubeconfig path on stdout
#   kind.sh load IMAGE...     load local images into the workers (the control plane runs no pod of ours)
#   kind.sh down              delete it
#
#   KUBECONFIG=$(e2e/cluster/kind.sh up) python -m pytest e2e/real
#
# The node image is, by default, the one kindnode.sh builds here with no registry, whose images
# kubeadm is pointed at by a patch; or KIND_NODE_IMAGE, on a machine that reaches kind's registry:
# `default` for the kindest/node image of kind's release, or any other image. kind is the one
# build.sh builds unless KIND names another. Every node mounts the host's $CACHE/real/volumes at the
# same path: hostPath volumes there are shared by the nodes, as a ReadWriteMany volume (NFS, EFS,
# Filestore) is on a real cluster.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
NAME="${PSOPERATOR_CLUSTER:-psoperator}"
CACHE="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}"
KUBECONFIG_PATH="$CACHE/kind-$NAME.kubeconfig"
VOLUMES="$CACHE/real/volumes"
GPUS_PER_NODE=4
KIND="${KIND:-$CACHE/bin/kind}"

log() { printf '[kind %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
kind() { "$KIND" "$@"; }
kctl() { "$CACHE/bin/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# The cluster's configuration; kubeadm patches for the node image built here (its images' names)
# and for a cgroup v1 host (which the kubelet refuses unless told not to).
config() {
  local mounts="extraMounts: [{hostPath: \"$VOLUMES\", containerPath: \"$VOLUMES\"}]"
  cat <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
- role: control-plane
  $mounts
- role: worker
  labels:
    psoperator.io/pool: cpu
  $mounts
- role: worker
  labels:
    psoperator.io/pool: gpu
    nvidia.com/gpu.present: "true"
  $mounts
  kubeadmConfigPatches:
  - |
    kind: JoinConfiguration
    nodeRegistration:
      taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
kubeadmConfigPatches:
EOF
  if [ -z "${KIND_NODE_IMAGE:-}" ]; then
    cat <<EOF
- |
  kind: ClusterConfiguration
  imageRepository: psoperator.local
  etcd:
    local:
      imageTag: $(cat "$CACHE/bin/.etcd.version")
  dns:
    imageTag: $(cat "$CACHE/bin/.coredns.version")
EOF
  fi
  if [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
    printf '%s\n' '- |' '  kind: KubeletConfiguration' '  failCgroupV1: false'
  fi
}

up() {
  mkdir -p "$CACHE" "$VOLUMES"
  [ -x "$KIND" ] || "$HERE/build.sh" kind >&2
  "$HERE/dockerd.sh"
  if ! kind get clusters 2>/dev/null | grep -qx "$NAME"; then
    local image=${KIND_NODE_IMAGE:-} flag=()
    case $image in
      "") image=$("$HERE/kindnode.sh"); flag=(--image "$image") ;;
      default) image="kind's default" ;;
      *) flag=(--image "$image") ;;
    esac
    log "creating kind cluster $NAME from $image"
    config | kind create cluster --name "$NAME" --kubeconfig "$KUBECONFIG_PATH" --wait 300s \
      "${flag[@]}" --config - >&2
  fi
  kind get kubeconfig --name "$NAME" > "$KUBECONFIG_PATH"
  local node
  for node in $(kctl get nodes -l nvidia.com/gpu.present=true -o name); do
    # An extended resource advertised on the node status is kept by the kubelet and scheduled on.
    kctl patch "$node" --subresource=status --type=merge \
      -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$GPUS_PER_NODE\"}}}" >/dev/null
  done
  # The nodes are Ready before their pod network is: wait for the CNI and DNS.
  kctl -n kube-system rollout status daemonset --timeout=300s >&2
  kctl -n kube-system rollout status deployment/coredns --timeout=300s >&2
  echo "$KUBECONFIG_PATH"
}

case "${1:-}" in
  up) up ;;
  load)
    shift
    log "loading images: $*"
    workers=$(kind get nodes --name "$NAME" | grep -v -- -control-plane | paste -sd, -)
    # One image at a time: kind sends every image it is given to a node that lacks any of them
    # (the test run's third image re-sent the demo's two, 1.6 GB each).
    for image in "$@"; do kind load docker-image --name "$NAME" --nodes "$workers" "$image" >&2; done
    ;;
  down) kind delete cluster --name "$NAME" >&2; rm -f "$KUBECONFIG_PATH" ;;
  *) echo "usage: $0 up | load IMAGE... | down" >&2; exit 2 ;;
esac

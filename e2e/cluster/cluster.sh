#!/usr/bin/env bash
# The local control plane for e2e tests: real kube-apiserver, kube-controller-manager, kube-scheduler
# and etcd run by kwokctl's binary runtime, with KWOK simulating nodes and pod lifecycles.
#
#   cluster.sh build        build the binaries into the cache (idempotent), kind's node's too
#   cluster.sh up           build what is missing, create or start the cluster, add its nodes;
#                           prints the kubeconfig path on stdout (progress on stderr)
#   cluster.sh down         delete the cluster; no process or port is left behind
#   cluster.sh kubeconfig   print the kubeconfig path
#   cluster.sh config       write and print the kwokctl configuration
#
# The nodes are KWOK's (simulated: hundreds of pods, injected kubelet states). Real containers run
# on kind (kind.sh).
#
# Everything lives under ${PSOPERATOR_CACHE:-~/.cache/psoperator}; the cluster is named
# ${PSOPERATOR_CLUSTER:-psoperator}. Nothing is downloaded: kwokctl gets a local path for every
# binary.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}"
BIN="$CACHE/bin"
NAME="${PSOPERATOR_CLUSTER:-psoperator}"
K8S_VERSION="${K8S_VERSION:-v1.35.4}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"

# kwokctl keeps clusters, its cache and its default config under KWOK_WORKDIR (not ~/.kwok).
export KWOK_WORKDIR="$CACHE/kwok"
# kwokctl runs the first kubectl on PATH; it must be ours, not whatever the machine has.
export PATH="$BIN:$PATH"
WORKDIR="$KWOK_WORKDIR/clusters/$NAME"
KUBECONFIG_PATH="$WORKDIR/kubeconfig.yaml"
CONFIG="$CACHE/clusters/$NAME.kwokctl.yaml"
STAMP="$WORKDIR/psoperator-config.sha256"

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
kctl() { kubectl --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# Simulated nodes: name, pool, cpu, memory, gpus, index. Index n gives the node the address
# 127.42.0.n and the pod CIDR 127.42.n.0/24, so pod IPs are on loopback and a test can serve a
# pod's endpoints (e.g. the chief's progress endpoint) on this machine.
NODES=(
  "cpu-0 cpu 16 64Gi 0 1"
  "cpu-1 cpu 16 64Gi 0 2"
  "gpu-0 gpu 32 256Gi 4 3"
  "gpu-1 gpu 32 256Gi 4 4"
)

render_config() {
  mkdir -p "$(dirname "$CONFIG")"
  render_kwok_config > "$CONFIG"
}

render_kwok_config() {
  cat <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  runtime: binary
  bindAddress: 127.0.0.1
  kubeVersion: $K8S_VERSION
  kwokVersion: $KWOK_VERSION
  etcdVersion: ${ETCD_VERSION#v}
  kubeAuthorization: true
  kubeAdmission: true
  cacheDir: $KWOK_WORKDIR/cache
  kubeApiserverBinary: $BIN/kube-apiserver
  kubeControllerManagerBinary: $BIN/kube-controller-manager
  kubeSchedulerBinary: $BIN/kube-scheduler
  kubectlBinary: $BIN/kubectl
  kwokControllerBinary: $BIN/kwok
  etcdBinary: $BIN/etcd
  # Not built; pointing at local paths means kwokctl errors instead of downloading.
  etcdctlBinary: $BIN/etcdctl
  etcdutlBinary: $BIN/etcdutl
  # Scales node-monitor period/grace and the node lease (10s/80s/80s): NotReady is noticed quickly,
  # yet a busy 2-core machine does not lose its simulated nodes.
  heartbeatFactor: 2
---
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
# kwokctl passes this on without defaulting it, so every option that must be non-zero is set.
options:
  cidr: 127.42.255.0/24
  nodeIP: 127.42.0.254
  podPlayStageParallelism: 4
  nodePlayStageParallelism: 4
  nodeLeaseParallelism: 4
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
EOF
  cat "$HERE/kwok-stages.yaml"
}

config_hash() { { cat "$CONFIG"; printf '%s\n' "${NODES[@]}"; } | sha256sum | cut -d' ' -f1; }

api_ready() { [ -f "$KUBECONFIG_PATH" ] && kctl get --raw /readyz >/dev/null 2>&1; }

wait_for() {  # seconds description command...
  local deadline=$((SECONDS + $1)) what="$2"; shift 2
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || die "timed out waiting for $what"
    sleep 1
  done
}

# Pid files have no trailing newline; awk keeps one pid per line.
cluster_pids() { awk 1 "$WORKDIR"/pids/*.pid 2>/dev/null || true; }

node_manifest() {  # name pool cpu memory gpus index
  local name=$1 pool=$2 cpu=$3 mem=$4 gpus=$5 n=$6
  cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $name
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/arch: amd64
    kubernetes.io/os: linux
    kubernetes.io/hostname: $name
    kubernetes.io/role: agent
    node-role.kubernetes.io/agent: ""
    type: kwok
    psoperator.io/pool: $pool
EOF
  if [ "$gpus" -gt 0 ]; then
    cat <<EOF
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.count: "$gpus"
    nvidia.com/gpu.product: Simulated-GPU
EOF
  fi
  cat <<EOF
spec:
  podCIDR: 127.42.$n.0/24
  podCIDRs: [127.42.$n.0/24]
EOF
  if [ "$gpus" -gt 0 ]; then
    cat <<EOF
  taints:
  - key: nvidia.com/gpu
    value: present
    effect: NoSchedule
EOF
  fi
  local resources="    cpu: \"$cpu\"
    memory: $mem
    pods: \"110\"
    ephemeral-storage: 200Gi"
  [ "$gpus" -gt 0 ] && resources+="
    nvidia.com/gpu: \"$gpus\""
  cat <<EOF
status:
  addresses:
  - type: InternalIP
    address: 127.42.0.$n
  - type: Hostname
    address: $name
  capacity:
$resources
  allocatable:
$resources
EOF
}

create_nodes() {
  local spec name
  for spec in "${NODES[@]}"; do
    # shellcheck disable=SC2086
    set -- $spec
    name=$1
    # Created once and never re-applied: the node lifecycle controller owns taints afterwards.
    kctl get node "$name" >/dev/null 2>&1 && continue
    node_manifest "$@" | kctl create -f - >/dev/null
    log "node $name created"
  done
}

nodes_ready() {
  local spec
  for spec in "${NODES[@]}"; do
    # shellcheck disable=SC2086
    set -- $spec
    [ "$(kctl get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] \
      || return 1
  done
}

# A pid from the cluster's pid files that still runs one of this cluster's binaries.
ours() { [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' < "/proc/$1/cmdline" | grep -qF "$WORKDIR/"; }

delete_cluster() {
  local pids pid deadline
  pids=$(cluster_pids)
  # kwokctl SIGKILLs each component by pid file, but gives up at the first one it cannot stop
  # (e.g. one that already died), so whatever is left is killed here.
  kwokctl delete cluster --name "$NAME" --kubeconfig "$KUBECONFIG_PATH" >&2 || log "kwokctl delete failed; cleaning up"
  deadline=$((SECONDS + 10))
  for pid in $pids; do
    while ours "$pid"; do
      if [ "$SECONDS" -ge "$deadline" ]; then kill -9 "$pid" 2>/dev/null || true; fi
      sleep 0.2
    done
  done
  rm -rf "$WORKDIR"
}

cmd_up() {
  "$HERE/build.sh" >&2
  render_config
  local want
  want=$(config_hash)
  if [ -d "$WORKDIR" ] && [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
    log "cluster $NAME was made from another configuration: recreating"
    delete_cluster
  fi
  if [ -d "$WORKDIR" ]; then
    if api_ready; then
      log "cluster $NAME: running"
    else
      # Stopped (e.g. the machine or session was restarted): a test cluster holds nothing worth
      # keeping, and recreating it (seconds) is more reliable than restarting half-dead components.
      log "cluster $NAME: not running; recreating"
      delete_cluster
    fi
  fi
  if [ ! -d "$WORKDIR" ]; then
    log "cluster $NAME: creating (kwokctl binary runtime, $K8S_VERSION)"
    # 9>&-: the components kwokctl leaves running must not inherit (and hold) the lock.
    kwokctl create cluster --name "$NAME" --config "$CONFIG" --kubeconfig "" --timeout 3m >&2 9>&-
    echo "$want" > "$STAMP"
  fi
  wait_for 120 "the API server of $NAME" api_ready
  wait_for 60 "the default service account" kctl get serviceaccount default -n default -o name >/dev/null
  create_nodes
  wait_for 60 "the simulated nodes to be Ready" nodes_ready
  log "cluster $NAME: ready ($(kctl get nodes --no-headers | wc -l) nodes)"
  echo "$KUBECONFIG_PATH"
}

cmd_down() {
  if [ ! -d "$WORKDIR" ]; then
    log "cluster $NAME: not present"
    return
  fi
  log "cluster $NAME: deleting"
  delete_cluster
  log "cluster $NAME: deleted"
}

# Two test sessions bringing the same cluster up or down at once would trip over each other.
locked() {
  mkdir -p "$CACHE/clusters"
  exec 9>"$CACHE/clusters/$NAME.lock"
  flock -w 600 9 || { log "error: another cluster.sh holds $CACHE/clusters/$NAME.lock"; exit 1; }
  "$@"
}

case "${1:-}" in
  build) "$HERE/build.sh" && exec "$HERE/build.sh" kind ;;
  config) render_config; echo "$CONFIG" ;;
  up) locked cmd_up ;;
  down) locked cmd_down ;;
  kubeconfig)
    echo "$KUBECONFIG_PATH"
    [ -f "$KUBECONFIG_PATH" ] || { log "cluster $NAME is not up (run: $0 up)"; exit 1; }
    ;;
  *) echo "usage: $0 build|up|down|kubeconfig|config" >&2; exit 2 ;;
esac

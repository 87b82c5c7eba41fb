#!/usr/bin/env bash
# A real node for the local control plane: kubelet on Debian's containerd + runc, pods in their own
# network namespaces on a private bridge (CNI bridge + host-local), Services through kube-proxy
# (iptables), cluster DNS from CoreDNS, a pause image built from pause.c. Called by cluster.sh:
#
#   realnode.sh network                       the bridge and its guard rules (before the API server)
#   realnode.sh up KUBECONFIG PKI_DIR         containerd, CoreDNS, kube-proxy, kubelet; node Ready
#   realnode.sh load IMAGE...                 docker save | ctr import into the node's containerd
#   realnode.sh down                          stop everything, remove every container and rule
#
# Addresses: pods 10.232.0.0/16 on bridge psop0 (the host is 10.232.0.1: node IP, API server
# endpoint, DNS), Services 10.233.0.0/24. Nothing leaves this machine: a FORWARD rule drops pod
# traffic to any address outside the pod network, and pods get no masquerade to the outside.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}"
BIN="$CACHE/bin"
NODE="${PSOPERATOR_REAL_NODE:-real-0}"
STATE="$CACHE/real"             # containerd images and snapshots, kubelet, logs: survive `down`
RUN=/run/psoperator-real        # sockets, pids, containerd state: gone with `down`
SOCK="$RUN/containerd.sock"
BRIDGE=psop0
HOST_IP=10.232.0.1
POD_CIDR=10.232.0.0/16
SERVICE_CIDR=10.233.0.0/24
PAUSE_IMAGE=psoperator.local/pause:1
GPUS=4

log() { printf '[realnode %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
ctr_() { ctr --address "$SOCK" --namespace k8s.io "$@"; }
# The distribution's client matches the distribution's daemon (see dockerd.sh).
docker() { if [ -x /usr/bin/docker ]; then /usr/bin/docker "$@"; else command docker "$@"; fi; }

wait_for() {  # seconds description command...
  local deadline=$((SECONDS + $1)) what="$2"; shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "timed out waiting for $what (logs: $STATE/logs)"
    sleep 0.5
  done
}

need_packages() {
  local missing=() cmd pkg
  for pair in containerd:containerd runc:runc iptables:iptables \
              conntrack:conntrack gcc:gcc; do
    cmd=${pair%%:*} pkg=${pair#*:}
    command -v "$cmd" >/dev/null || missing+=("$pkg")
  done
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  [ ${#missing[@]} -eq 0 ] && return
  log "installing ${missing[*]} (Debian)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

start() {  # name command...: a daemon with its log and pid file
  local name=$1; shift
  mkdir -p "$STATE/logs" "$RUN/pids"
  # setsid: the daemon outlives this script; 9>&-: it must not hold cluster.sh's lock.
  setsid "$@" >"$STATE/logs/$name.log" 2>&1 < /dev/null 9>&- &
  echo $! > "$RUN/pids/$name.pid"
}

running() { [ -f "$RUN/pids/$1.pid" ] && kill -0 "$(cat "$RUN/pids/$1.pid")" 2>/dev/null; }

stop() {  # name
  local pid
  [ -f "$RUN/pids/$1.pid" ] || return 0
  pid=$(cat "$RUN/pids/$1.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$RUN/pids/$1.pid"
}

cmd_network() {
  need_packages
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$HOST_IP/16" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  # Service traffic between two pods of the bridge must pass through kube-proxy's NAT rules.
  [ -w /proc/sys/net/bridge/bridge-nf-call-iptables ] || modprobe br_netfilter 2>/dev/null || true
  echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
  echo 1 > /proc/sys/net/ipv4/ip_forward
  # The guard: pods talk to pods, Services and this host, never to anything beyond it.
  iptables -C FORWARD -s "$POD_CIDR" ! -d "$POD_CIDR" -j DROP 2>/dev/null \
    || iptables -I FORWARD 1 -s "$POD_CIDR" ! -d "$POD_CIDR" -j DROP
  # A Service address that kube-proxy has not (yet) translated goes nowhere.
  ip route replace blackhole "$SERVICE_CIDR"
}

# Writes stdin to a file only when it differs: kube-proxy exits when its configuration file changes.
put() {
  local tmp
  tmp=$(mktemp)
  cat > "$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}

write_configs() {  # kubeconfig pki_dir
  local kubeconfig=$1 pki=$2
  mkdir -p "$STATE/cni" "$STATE/etc" "$RUN"
  put "$STATE/etc/containerd.toml" <<EOF
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd"
[grpc]
  address = "$SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # This sandbox lacks CAP_SYS_RESOURCE: the kubelet's negative OOM scores are clamped instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni"
EOF
  put "$STATE/cni/10-psoperator.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "psoperator-real",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR", "rangeStart": "10.232.1.1", "gateway": "$HOST_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$STATE/cni-ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  put "$STATE/etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host mounts cgroup v1 (hybrid); Kubernetes 1.35 refuses it unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$SOCK
address: $HOST_IP
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [$HOST_IP]
# Pods resolve cluster names only: no upstream resolver, nothing outside this machine.
resolvConf: ""
failSwapOn: false
serializeImagePulls: false
evictionHard: {memory.available: 200Mi, nodefs.available: 2%, imagefs.available: 2%}
imageGCHighThresholdPercent: 95
imageGCLowThresholdPercent: 90
nodeStatusReportFrequency: 10s
EOF
  put "$STATE/etc/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $kubeconfig}
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the host's conntrack sysctls alone (this sandbox may not allow writing them).
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  put "$STATE/etc/Corefile" <<EOF
cluster.local in-addr.arpa ip6.arpa {
    bind $HOST_IP
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $kubeconfig
        pods insecure
        ttl 5
    }
    cache 5
}
EOF
}

build_pause() {
  docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1 && return
  local dir
  dir=$(mktemp -d)
  gcc -static -Os -s -o "$dir/pause" "$HERE/pause.c"
  tar -C "$dir" -c pause | docker import --change 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null
  rm -rf "$dir"
  log "pause image $PAUSE_IMAGE built from pause.c"
}

# Loads each image unless the node already holds that very image (the docker image ID it was
# loaded from is kept beside containerd's store, which survives `down`).
cmd_load() {  # image...
  local image id stamp
  mkdir -p "$STATE/loaded"
  for image in "$@"; do
    id=$(docker image inspect -f '{{.Id}}' "$image")
    stamp="$STATE/loaded/$(echo "$image" | tr '/:' '__')"
    if [ "$(cat "$stamp" 2>/dev/null)" = "$id" ] && ctr_ images ls -q | grep -qE "(^|/)$image\$"; then
      log "$image: already on the node"
      continue
    fi
    log "loading $image into the node's containerd"
    docker save "$image" | ctr_ images import - >/dev/null
    echo "$id" > "$stamp"
  done
}

node_ready() {
  [ "$(kubectl --kubeconfig "$1" get node "$NODE" \
      -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

cmd_up() {  # kubeconfig pki_dir
  local kubeconfig=$1 pki=$2
  cmd_network
  write_configs "$kubeconfig" "$pki"
  "$HERE/dockerd.sh"
  running containerd || start containerd containerd --config "$STATE/etc/containerd.toml"
  wait_for 30 containerd ctr_ version
  build_pause
  ctr_ images ls -q | grep -qx "$PAUSE_IMAGE" || cmd_load "$PAUSE_IMAGE"
  running coredns || start coredns "$BIN/coredns" -conf "$STATE/etc/Corefile"
  running kube-proxy || start kube-proxy "$BIN/kube-proxy" --config "$STATE/etc/kube-proxy.yaml"
  running kubelet || start kubelet "$BIN/kubelet" \
    --config "$STATE/etc/kubelet.yaml" --kubeconfig "$kubeconfig" \
    --root-dir "$STATE/kubelet" --cert-dir "$STATE/kubelet/pki" \
    --hostname-override "$NODE" --node-ip "$HOST_IP" \
    --node-labels "psoperator.io/pool=real,nvidia.com/gpu.present=true"
  wait_for 120 "node $NODE Ready" node_ready "$kubeconfig"
  # No GPU here: an extended resource advertised on the node status lets GPU workers schedule (the
  # kubelet keeps resources that no device plugin manages), as kind.sh does.
  kubectl --kubeconfig "$kubeconfig" patch node "$NODE" --subresource=status --type=merge \
    -p "{\"status\":{\"capacity\":{\"nvidia.com/gpu\":\"$GPUS\"}}}" >/dev/null
  wait_for 30 "kube-proxy" curl -sf http://127.0.0.1:10256/healthz
  log "node $NODE: Ready (kubelet, containerd, kube-proxy, CoreDNS on $HOST_IP)"
}

remove_pods() {
  [ -S "$SOCK" ] || return 0
  local id
  for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -a -s SIGKILL "$id" >/dev/null 2>&1 || true; done
  sleep 1
  for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
  for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
}

cmd_down() {
  stop kubelet
  remove_pods
  stop kube-proxy
  stop coredns
  stop containerd
  pkill -9 -f "containerd-shim-runc-v2 .*-address $SOCK" 2>/dev/null || true
  [ -x "$BIN/kube-proxy" ] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  # Pod sandboxes' network namespaces, kubelet's volume mounts (tmpfs for tokens), the sandboxes'
  # /dev/shm mounts in containerd's state.
  local m ns
  for ns in $(ip netns list 2>/dev/null | awk '/^cni-/{print $1}'); do ip netns delete "$ns" 2>/dev/null || true; done
  awk -v a="$STATE/" -v b="$RUN/" 'index($2, a) == 1 || index($2, b) == 1 {print $2}' /proc/mounts \
    | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
  rm -rf "$STATE/kubelet" "$STATE/cni-ipam" "$RUN"
  iptables -D FORWARD -s "$POD_CIDR" ! -d "$POD_CIDR" -j DROP 2>/dev/null || true
  ip route del blackhole "$SERVICE_CIDR" 2>/dev/null || true
  ip link del "$BRIDGE" 2>/dev/null || true
  log "node $NODE: down"
}

case "${1:-}" in
  network) cmd_network ;;
  up) shift; [ $# -eq 2 ] || die "usage: $0 up KUBECONFIG PKI_DIR"; cmd_up "$@" ;;
  load) shift; cmd_load "$@" ;;
  down) cmd_down ;;
  *) echo "usage: $0 network|up KUBECONFIG PKI_DIR|load IMAGE...|down" >&2; exit 2 ;;
esac

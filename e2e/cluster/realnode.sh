#!/usr/bin/env bash
# A real node for the local control plane: kubelet on Debian's containerd + runc, pods in their own
# network namespaces on a private bridge (CNI bridge + host-local), Services through kube-proxy
# (iptables), cluster DNS from CoreDNS, NetworkPolicies enforced by kube-router's policy controller
# (iptables and ipset), a pause image built from pause.c. Called by cluster.sh:
#
#   realnode.sh network                       the bridge and its guard rules (before the API server)
#   realnode.sh up KUBECONFIG PKI_DIR         containerd, CoreDNS, kube-proxy, kubelet; node Ready;
#                                             then the enforcer, once it has synced
#   realnode.sh load IMAGE...                 docker save | ctr import into the node's containerd
#   realnode.sh enforcer                      whether the enforcer is ready (exit 0), or why not:
#                                             1 not ready, 2 not built or installed, 3 this
#                                             kernel cannot run it
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
ENFORCER_METRICS_PORT=20245     # kube-router's metrics, on loopback (e2e/real/test_network_policy.py)
ENFORCER_LOG="$STATE/logs/kube-router.log"

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
  for pair in containerd:containerd runc:runc iptables:iptables ipset:ipset \
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
  # The guard: pods talk to pods, Services and this host, never to anything beyond it. In mangle's
  # FORWARD, which runs before filter's: kube-router's jump at the top of filter FORWARD accepts
  # whatever the policies allow, and would pass a guard placed after it.
  iptables -t mangle -C FORWARD -s "$POD_CIDR" ! -d "$POD_CIDR" -j DROP 2>/dev/null \
    || iptables -t mangle -I FORWARD 1 -s "$POD_CIDR" ! -d "$POD_CIDR" -j DROP
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

# --- The NetworkPolicy enforcer: kube-router's policy controller alone (see build.sh for why this
# one, and why its advisories do not reach it). No BGP router, service proxy or load balancer; its
# health port (every address, with pprof) off; metrics on loopback. It finds this node's pods by
# host IP and sees same-bridge traffic through physdev (bridge-nf-call-iptables, cmd_network).

# The rule forms the policy controller writes, loaded in a throw-away network namespace: whether
# this kernel can run it (ipset hash:ip and hash:net, set, physdev, addrtype, conntrack, mark,
# multiport, limit, NFLOG, REJECT). Prints why not; the host's own rules are not touched.
enforcer_probe() {
  local out
  out=$(unshare --net sh -c 'ipset create PSOP-PROBE-IP hash:ip timeout 0 &&
    ipset create PSOP-PROBE-NET hash:net timeout 0 && iptables-restore' 2>&1 <<'RULES'
*filter
:PSOP-PROBE - [0:0]
-A FORWARD -m comment --comment "probe" -j PSOP-PROBE
-A PSOP-PROBE -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A PSOP-PROBE -m conntrack --ctstate INVALID -j DROP
-A PSOP-PROBE -m addrtype --src-type LOCAL -d 10.0.0.1 -j ACCEPT
-A PSOP-PROBE -m physdev --physdev-is-bridged -d 10.0.0.1 -j RETURN
-A PSOP-PROBE -p tcp -m set --match-set PSOP-PROBE-IP src -m set --match-set PSOP-PROBE-NET dst -m tcp --dport 2222 -j MARK --set-xmark 0x10000/0x10000
-A PSOP-PROBE -p tcp -m addrtype --dst-type LOCAL -m multiport --dports 30000:32767 -j RETURN
-A PSOP-PROBE -m mark ! --mark 0x10000/0x10000 -j NFLOG --nflog-group 100 -m limit --limit 10/minute --limit-burst 10
-A PSOP-PROBE -m mark ! --mark 0x10000/0x10000 -j REJECT
-A PSOP-PROBE -j MARK --set-mark 0x20000/0x20000
COMMIT
RULES
  ) && return 0
  echo "this kernel cannot load kube-router's rules: ${out%%$'\n'*}"
  return 1
}

metric() {  # name: its value on the enforcer's metrics endpoint
  curl -sf "http://127.0.0.1:$ENFORCER_METRICS_PORT/metrics" | awk -v m="$1" '$1 == m {print $2}'
}

# Ready: it answers on its metrics, has synced its rules at least once, its forward chain exists,
# and no sync was aborted. Prints why not.
enforcer_ready() {
  running kube-router || { echo "kube-router is not running (log: $ENFORCER_LOG)"; return 1; }
  local aborted syncs
  aborted=$(grep -m1 'Aborting sync' "$ENFORCER_LOG") && { echo "kube-router: $aborted"; return 1; }
  syncs=$(metric kube_router_controller_iptables_sync_time_count)
  [ -n "$syncs" ] || { echo "kube-router's metrics do not answer"; return 1; }
  awk -v n="$syncs" 'BEGIN {exit !(n >= 1)}' || { echo "kube-router has not synced yet"; return 1; }
  iptables -n -L KUBE-ROUTER-FORWARD >/dev/null 2>&1 || { echo "no KUBE-ROUTER-FORWARD chain"; return 1; }
}

cmd_enforcer() {
  command -v ipset >/dev/null || { echo "ipset is not installed (apt-get install ipset)"; return 2; }
  enforcer_probe || return 3
  [ -x "$BIN/kube-router" ] || { echo "kube-router is not built (e2e/cluster/cluster.sh build)"; return 2; }
  enforcer_ready || return 1
  echo ready
}

# A ServiceAccount whose token lists and watches what every informer of kube-router needs (it
# waits for all of them to sync, the policy controller's or not); a token file, renewed at each
# `up`, that client-go re-reads.
enforcer_kubeconfig() {  # kubeconfig pki_dir
  local kubeconfig=$1 pki=$2 server
  kubectl --kubeconfig "$kubeconfig" apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-router, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: psoperator-kube-router}
rules:
- apiGroups: [""]
  resources: [pods, namespaces, nodes, services, endpoints]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: psoperator-kube-router}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: psoperator-kube-router}
subjects: [{kind: ServiceAccount, name: kube-router, namespace: kube-system}]
YAML
  kubectl --kubeconfig "$kubeconfig" create token kube-router -n kube-system --duration 24h \
    | put "$STATE/etc/kube-router.token"
  server=$(kubectl --kubeconfig "$kubeconfig" config view --minify -o 'jsonpath={.clusters[0].cluster.server}')
  put "$STATE/etc/kube-router.kubeconfig" <<YAML
apiVersion: v1
kind: Config
clusters: [{name: real, cluster: {server: "$server", certificate-authority: "$pki/ca.crt"}}]
users: [{name: kube-router, user: {tokenFile: "$STATE/etc/kube-router.token"}}]
contexts: [{name: real, context: {cluster: real, user: kube-router}}]
current-context: real
YAML
}

start_enforcer() {  # kubeconfig pki_dir
  local why
  [ -x "$BIN/kube-router" ] || { log "kube-router is not built: NetworkPolicies are not enforced"; return; }
  why=$(enforcer_probe) || { log "NetworkPolicies are not enforced: $why"; return; }
  enforcer_kubeconfig "$@"
  running kube-router || start kube-router "$BIN/kube-router" \
    --kubeconfig "$STATE/etc/kube-router.kubeconfig" --hostname-override "$NODE" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --run-firewall=true --run-router=false --run-service-proxy=false --run-loadbalancer=false \
    --health-port=0 --metrics-addr=127.0.0.1 --metrics-port="$ENFORCER_METRICS_PORT"
  wait_for 120 "kube-router's first sync" enforcer_ready
  log "kube-router: synced, NetworkPolicies enforced"
}

# Never kube-router's --cleanup-config: it destroys every ipset of the host. Only its own chains
# (the jumps to them first) and sets.
remove_enforcer_rules() {
  local chain n chains
  for chain in INPUT FORWARD OUTPUT; do
    for n in $(iptables -n -L "$chain" --line-numbers 2>/dev/null | awk '$2 ~ /^KUBE-ROUTER-/ {print $1}' | sort -rn); do
      iptables -D "$chain" "$n" || true
    done
  done
  chains=$(iptables -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^KUBE-(ROUTER|POD-FW|NWPLCY)-/ {print $2}')
  for chain in $chains; do iptables -F "$chain" || true; done
  for chain in $chains; do iptables -X "$chain" || true; done
  command -v ipset >/dev/null || return 0
  local set
  for set in $(ipset list -n 2>/dev/null | grep -E '^KUBE-(SRC|DST)-'); do ipset destroy "$set" || true; done
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
  start_enforcer "$kubeconfig" "$pki"
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
  stop kube-router
  remove_enforcer_rules
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
  iptables -t mangle -D FORWARD -s "$POD_CIDR" ! -d "$POD_CIDR" -j DROP 2>/dev/null || true
  ip route del blackhole "$SERVICE_CIDR" 2>/dev/null || true
  ip link del "$BRIDGE" 2>/dev/null || true
  log "node $NODE: down"
}

case "${1:-}" in
  network) cmd_network ;;
  up) shift; [ $# -eq 2 ] || die "usage: $0 up KUBECONFIG PKI_DIR"; cmd_up "$@" ;;
  load) shift; cmd_load "$@" ;;
  enforcer) cmd_enforcer ;;
  down) cmd_down ;;
  *) echo "usage: $0 network|up KUBECONFIG PKI_DIR|load IMAGE...|enforcer|down" >&2; exit 2 ;;
esac

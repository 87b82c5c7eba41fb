#!/usr/bin/env bash
# Builds the local control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd, kwok, kwokctl), what the kind node image adds (kubeadm, kubelet, kube-proxy, CoreDNS,
# kube-router: the CNI and NetworkPolicy enforcer), helm, and prometheus and promtool (the metrics,
# alert and dashboard tests) from the Go module proxy into a cache outside the repo.
# Idempotent: a component already in the cache is not rebuilt. Prints progress.
# `build.sh kueue` builds only Kueue's manager and puts its Helm chart in the cache (images/build.sh
# kueue calls it, for the tests that install Kueue, and e2e/run-tests.sh); the default target, which
# `cluster.sh up` and so the demo run, does not build it.
# `build.sh kind` builds only kind, crictl and the Kubernetes binaries (kubeadm among them) its node
# image holds (e2e/cluster/kindnode.sh calls it).
# `build.sh seaweedfs` builds only SeaweedFS's `weed`, the S3-compatible store of the s3://
# checkpoint tests (images/build.sh seaweedfs calls it, and e2e/run-tests.sh).
# `build.sh training-operator` builds only Kubeflow's training-operator v1, the benchmark's peer
# (`python -m e2e.bench` calls it when the tfjob kind is chosen); the default target, which CI runs,
# does not build it.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.19.0}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.14.7}"
# The Go module of Prometheus 3.x.y is tagged v0.3xx.y: v0.316.0 is Prometheus 3.16.0.
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
# The only version of kube-router v2 the Go module proxy serves (see build_kube_router).
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
# The only version the Go module proxy serves under this path (no v1.9.x).
TRAINING_OPERATOR_VERSION="${TRAINING_OPERATOR_VERSION:-v1.8.1}"
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"
# SeaweedFS's release tags are no semantic versions: the Go module proxy serves pseudo-versions.
SEAWEEDFS_VERSION="${SEAWEEDFS_VERSION:-v0.0.0-20261109003541-7506e5f91cd6}"
KIND_VERSION="${KIND_VERSION:-v0.33.0}"
# The proxy serves no v1.35.x; crictl talks CRI v1 to any recent containerd.
CRICTL_VERSION="${CRICTL_VERSION:-v1.34.0}"
CACHE="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}"
BIN="$CACHE/bin"
WORK="$CACHE/build"

mkdir -p "$BIN" "$WORK"
export GOFLAGS="${GOFLAGS:--buildvcs=false}" CGO_ENABLED=0

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
have() { [ -x "$BIN/$1" ] && [ -f "$BIN/.$1.version" ] && [ "$(cat "$BIN/.$1.version")" = "$2" ]; }
mark() { echo "$2" > "$BIN/.$1.version"; }

# k8s.io/kubernetes pins its staging modules at v0.0.0 and replaces them with local paths, which a
# dependent module ignores; a wrapper module replaces each with the published v0.<minor>.<patch>.
build_kubernetes() {
  local want=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy kubeadm) missing=()
  for b in "${want[@]}"; do have "$b" "$K8S_VERSION" || missing+=("$b"); done
  [ ${#missing[@]} -eq 0 ] && { log "kubernetes $K8S_VERSION: cached"; return; }
  local dir="$WORK/kubernetes-$K8S_VERSION" staging="v0.${K8S_VERSION#v1.}"
  mkdir -p "$dir" && cd "$dir"
  rm -f go.mod && go mod init psoperator.local/build/kubernetes >/dev/null 2>&1
  log "kubernetes $K8S_VERSION: resolving modules"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
  # Only the staging modules are pinned at exactly v0.0.0; pseudo-versions (k8s.io/utils,
  # kube-openapi) are real published versions and must stay.
  grep -oE '^\s+k8s\.io/[a-z0-9-]+ v0\.0\.0( |$)' "$gomod" | awk '{print $1}' | sort -u | while read -r m; do
    go mod edit -replace "$m=$m@$staging"
  done
  {
    echo '//go:build tools'
    echo 'package tools'
    echo 'import ('
    for b in "${want[@]}"; do echo "  _ \"k8s.io/kubernetes/cmd/$b\""; done
    echo ')'
  } > tools.go
  go mod tidy >/dev/null
  local pkg="k8s.io/component-base/version" minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local ld="-s -w -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ld+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  ld+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  # One `go build` for all of them: shared packages compile once and the links run in parallel.
  log "kubernetes $K8S_VERSION: building ${missing[*]} (several minutes on 2 cores)"
  go build -trimpath -ldflags "$ld" -o "$BIN/" "${missing[@]/#/k8s.io/kubernetes/cmd/}"
  for b in "${missing[@]}"; do mark "$b" "$K8S_VERSION"; done
}

# etcd's server module has the same v0.0.0-style pins on its sibling modules; a wrapper main calls
# etcdmain like the upstream binary does.
build_etcd() {
  have etcd "$ETCD_VERSION" && { log "etcd $ETCD_VERSION: cached"; return; }
  local dir="$WORK/etcd-$ETCD_VERSION"
  mkdir -p "$dir" && cd "$dir"
  [ -f go.mod ] || go mod init psoperator.local/build/etcd >/dev/null 2>&1
  cat > main.go <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  go mod edit -require "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  go mod tidy >/dev/null
  log "etcd $ETCD_VERSION: building"
  go build -trimpath -ldflags "-s -w" -o "$BIN/etcd" .
  mark etcd "$ETCD_VERSION"
}

# CoreDNS with only the plugins of kubeadm's Corefile (errors, health, ready, kubernetes,
# prometheus, forward, cache, loop, reload, loadbalance), as CoreDNS documents building it as a
# library: a main that imports coremain and those plugins. The full binary compiles in every cloud
# SDK its other plugins use.
build_coredns() {
  have coredns "$COREDNS_VERSION" && { log "coredns $COREDNS_VERSION: cached"; return; }
  local dir="$WORK/coredns-$COREDNS_VERSION" start=$SECONDS module=github.com/coredns/coredns
  mkdir -p "$dir" && cd "$dir"
  rm -f go.mod go.sum && go mod init psoperator.local/build/coredns >/dev/null 2>&1
  {
    echo 'package main'
    echo 'import ('
    echo "  \"$module/coremain\""
    for p in errors health ready kubernetes metrics forward cache loop reload loadbalance; do
      echo "  _ \"$module/plugin/$p\""
    done
    echo ')'
    echo 'func main() { coremain.Run() }'
  } > main.go
  go mod edit -require "$module@$COREDNS_VERSION"
  go mod tidy >/dev/null
  log "coredns $COREDNS_VERSION: building"
  go build -trimpath -ldflags "-s -w -X $module/coremain.GitCommit=$COREDNS_VERSION" -o "$BIN/coredns" .
  mark coredns "$COREDNS_VERSION"
  log "coredns $COREDNS_VERSION: built in $((SECONDS - start)) s"
}

build_installable() {  # name version package [ldflags [tags]]
  have "$1" "$2" && { log "$1 $2: cached"; return; }
  local start=$SECONDS
  log "$1 $2: building"
  GOBIN="$BIN" go install -trimpath -tags "${5:-}" -ldflags "-s -w ${4:-}" "$3@$2"
  mark "$1" "$2"
  log "$1 $2: built in $((SECONDS - start)) s"
}

# The kind node image's CNI and NetworkPolicy enforcer: kube-router's router and policy controller
# (kind/kube-router.yaml). The proxy serves only v2.1.0. Of its reported advisories,
# GHSA-phqm-jgc3-qf8g (CVE-2026-32254) is the IPVS service proxy's handling of external IPs (its
# service proxy is off: kube-proxy runs), GHSA-fcmh-qfxc-w685 affects v2.7.0 and later only, and
# GHSA-v5mh-h5hx-7v92 is the routing controller's unauthenticated GoBGP API, which the DaemonSet's
# init container closes to all but loopback. Its old dependencies are raised in a wrapper module
# (tools.go keeps the main package required, as for Kubernetes above).
build_kube_router() {
  local name=kube-router version=$KUBE_ROUTER_VERSION module=github.com/cloudnativelabs/kube-router/v2
  have "$name" "$version" && { log "$name $version: cached"; return; }
  local dir="$WORK/$name-$version"
  mkdir -p "$dir" && cd "$dir"
  rm -f go.mod go.sum && go mod init "psoperator.local/build/$name" >/dev/null 2>&1
  printf '//go:build tools\npackage tools\nimport _ "%s/cmd/kube-router"\n' "$module" > tools.go
  go mod edit -require "$module@$version" -require golang.org/x/net@v0.62.0 \
    -require google.golang.org/grpc@v1.85.0 -require google.golang.org/protobuf@v1.36.12
  log "$name $version: resolving modules"
  go mod tidy >/dev/null
  log "$name $version: building (about 3 minutes on 2 cores)"
  go build -trimpath -ldflags "-s -w -X $module/pkg/version.Version=$version" -o "$BIN/$name" "$module/cmd/kube-router"
  mark "$name" "$version"
}

# Kubeflow's training-operator: its main package is .../cmd/training-operator.v1, which `go install`
# names "training-operator.v1". Its go.mod has no replace directives, so no wrapper module.
build_training_operator() {
  local name=training-operator version=$TRAINING_OPERATOR_VERSION
  have "$name" "$version" && { log "$name $version: cached"; return; }
  local dir="$WORK/$name-$version"
  mkdir -p "$dir"
  log "$name $version: building (a few minutes on 2 cores)"
  GOBIN="$dir" go install -trimpath -ldflags "-s -w" \
    "github.com/kubeflow/training-operator/cmd/training-operator.v1@$version"
  mv "$dir/training-operator.v1" "$BIN/$name"
  mark "$name" "$version"
}

# Kueue: its go.mod has no replace directives, so `go install` builds its manager as released (13
# minutes cold on 2 cores while another build ran); the module also carries its own Helm chart,
# copied into the cache for `helm install` (e2e/real/kueue.py).
build_kueue() {
  local name=kueue version=$KUEUE_VERSION module=sigs.k8s.io/kueue chart="$CACHE/charts/kueue-$KUEUE_VERSION"
  if [ ! -f "$chart/Chart.yaml" ]; then
    local dir
    dir=$(go mod download -json "$module@$version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    mkdir -p "$CACHE/charts" && rm -rf "$chart.part"
    cp -r "$dir/charts/kueue" "$chart.part" && chmod -R u+w "$chart.part" && mv "$chart.part" "$chart"
    log "$name $version: chart in $chart"
  fi
  build_installable "$name" "$version" "$module/cmd/kueue" "-X $module/pkg/version.GitVersion=$version"
}

# SeaweedFS (Apache-2.0): its one binary, `weed`, whose S3 gateway is the object store of the s3://
# checkpoint tests (tests/trainer/tfcluster/objectstore.py, e2e/real/objectstore.py). The module is
# served only as pseudo-versions, and its go.mod has a replace directive, so it is built as the main
# module, where `go mod download` put it.
build_seaweedfs() {
  local name=weed version=$SEAWEEDFS_VERSION module=github.com/seaweedfs/seaweedfs
  have "$name" "$version" && { log "$name $version: cached"; return; }
  local start=$SECONDS dir
  dir=$(go mod download -json "$module@$version" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  log "$name $version: building"
  (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$BIN/$name" ./weed)
  mark "$name" "$version"
  log "$name $version: built in $((SECONDS - start)) s"
}

log "cache: $BIN"
case "${1:-}" in
  training-operator) build_training_operator; exit 0 ;;
  seaweedfs) build_seaweedfs; exit 0 ;;
  kueue) build_kueue; exit 0 ;;
  kind)
    build_installable kind "$KIND_VERSION" sigs.k8s.io/kind
    build_installable crictl "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl \
      "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION"
    build_kubernetes
    exit 0 ;;
esac
build_etcd
build_installable kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
build_installable kwokctl "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwokctl "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
build_installable helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
build_kubernetes
build_coredns
prometheus_minor="${PROMETHEUS_VERSION#v0.3}"; prometheus_minor="${prometheus_minor%%.*}"
prometheus_ld="-X github.com/prometheus/common/version.Version=3.$((10#$prometheus_minor)).${PROMETHEUS_VERSION##*.}"
# The tests scrape static targets: no service discovery plugin (cloud SDKs) is compiled in, which
# takes a cold build from about 20 to about 7 minutes on 2 cores.
build_installable prometheus "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/prometheus "$prometheus_ld" remove_all_sd
build_installable promtool "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/promtool "$prometheus_ld" remove_all_sd
build_kube_router
log "done: $(ls "$BIN" | tr '\n' ' ')"

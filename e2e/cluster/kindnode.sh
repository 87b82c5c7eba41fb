#!/usr/bin/env bash
# Builds a kind node image with no container registry, from what build.sh builds: a Debian base
# made with mmdebstrap (systemd, containerd, runc, iptables, the CNI plugins), kind's own node files
# from its Go module (entrypoint, systemd units), kubeadm, kubelet, kubectl and crictl, and the images
# kubeadm runs (control plane, etcd, CoreDNS, kube-proxy, pause) plus the CNI's (kube-router), each
# built here from the same binaries and imported into the node's containerd before the image is
# committed. They are named psoperator.local/..., which kind.sh's kubeadm patch points kubeadm at.
#   kindnode.sh     build (or reuse) the image; prints its name on stdout
# Progress goes to stderr, ending with a table of each step's seconds.
set -euo pipefail
export LC_ALL=C
HERE="$(cd "$(dirname "$0")" && pwd)"
. "$HERE/../packages.sh"
CACHE="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}"
BIN="$CACHE/bin"
WORK="$CACHE/kind-node"
REPO=psoperator.local
# docker import sets no PATH.
PATH_ENV='ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
docker() { if [ -x /usr/bin/docker ]; then /usr/bin/docker "$@"; else command docker "$@"; fi; }
log() { printf '[kindnode %s] %s\n' "$(date +%T)" "$*" >&2; }

STEPS=()
timed() {  # NAME COMMAND...: runs COMMAND, records its wall time for the final table
  local name=$1 start=$SECONDS
  shift
  "$@"
  STEPS+=("$(printf '%-50s %5ds' "$name" $((SECONDS - start)))")
}

version() { cat "$BIN/.$1.version"; }

# The Debian bases, each a tarball in the cache whose name is a hash of what makes it.
NODE_PACKAGES=systemd,systemd-sysv,dbus,containerd,runc,containernetworking-plugins,iptables,conntrack,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,procps,ca-certificates,jq
NET_PACKAGES=iptables,ipset,conntrack,iproute2,kmod
debian_base() {  # NAME PACKAGES: imports the base (made if missing) as $REPO/NAME-base:KEY, prints that
  local name=$1 packages=$2 key tar image
  key=$(printf '%s\n' "$packages" bookworm | sha256sum | cut -c1-12)
  tar="$WORK/$name-base-$key.tar" image="$REPO/$name-base:$key"
  if ! docker image inspect "$image" >/dev/null 2>&1; then
    if [ ! -s "$tar" ]; then
      need_command mmdebstrap
      log "mmdebstrap $name base ($packages)"
      mmdebstrap --variant=minbase --format=tar --include="$packages" \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' bookworm "$tar.part" >&2
      mv "$tar.part" "$tar"
    fi
    docker import --change "$PATH_ENV" "$tar" "$image" >/dev/null
  fi
  echo "$image"
}

IMAGES=()  # what binary_image and net_image made, for the node's containerd

# One static binary on an empty base, run as its own entrypoint (kubeadm's manifests give the
# command of all but CoreDNS; the pause image is run as it is).
binary_image() {  # PATH TAG
  local name=${1##*/}
  local dir="$WORK/images/$name"
  rm -rf "$dir" && mkdir -p "$dir/usr/local/bin" && cp "$1" "$dir/usr/local/bin/"
  tar -C "$dir" -c usr | docker import --change "$PATH_ENV" \
    --change "ENTRYPOINT [\"/usr/local/bin/$name\"]" - "$REPO/$name:$2" >/dev/null
  IMAGES+=("$REPO/$name:$2")
}

net_image() {  # BINARY TAG BASE
  DOCKER_BUILDKIT=1 docker build -q --network=host -f "$HERE/kind/component.Dockerfile" \
    --build-arg "BASE=$3" --build-arg "BINARY=$1" -t "$REPO/$1:$2" "$BIN" >/dev/null
  IMAGES+=("$REPO/$1:$2")
}

build_images() {
  local k8s=$1 net_base=$2
  for b in kube-apiserver kube-controller-manager kube-scheduler; do binary_image "$BIN/$b" "$k8s"; done
  binary_image "$BIN/etcd" "$(version etcd)"
  binary_image "$BIN/coredns" "$(version coredns)"
  net_image kube-proxy "$k8s" "$net_base"
  net_image kube-router "$(version kube-router)" "$net_base"
  need_packages gcc libc6-dev  # a static pause binary
  mkdir -p "$WORK/pause" && gcc -static -Os -s -o "$WORK/pause/pause" "$HERE/pause.c"
  binary_image "$WORK/pause/pause" 1
}

# The build context: kind's node files (but the fuse-overlayfs unit, for rootless hosts, whose
# binary the node has not), the binaries, this directory's config and the CNI manifest.
context() {  # DIR
  local ctx=$1 kind_dir
  kind_dir=$(cd "$WORK" && go mod download -json "sigs.k8s.io/kind@$(version kind)" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  rm -rf "$ctx" && mkdir -p "$ctx/bin"
  cp -r "$kind_dir/images/base/files" "$ctx/kind-base" && chmod -R u+w "$ctx/kind-base"
  rm -f "$ctx/kind-base/etc/systemd/system/containerd-fuse-overlayfs.service" "$ctx/kind-base/etc/containerd/config.toml"
  cp "$BIN/kubeadm" "$BIN/kubelet" "$BIN/kubectl" "$BIN/crictl" "$ctx/bin/"
  cp "$HERE/kind/containerd.toml" "$HERE/runc-without-sys-resource" "$ctx/"
  sed "s|$REPO/kube-router:[^ ]*|$REPO/kube-router:$(version kube-router)|" "$HERE/kind/kube-router.yaml" > "$ctx/kube-router.yaml"
}

# Imports the images into the node's containerd (run by hand in a container of the image, not
# booted), as kind's own build does: content only, unpacked when a pod first runs, and pinned so
# that the kubelet's image garbage collection keeps them. Then commits the result.
commit_node() {  # STAGE IMAGE
  local stage=$1 image=$2 id archive="$WORK/images.tar"
  docker save -o "$archive" "${IMAGES[@]}"
  id=$(docker run -d --security-opt seccomp=unconfined --entrypoint sleep -v "$archive:/images.tar:ro" "$stage" infinity)
  docker exec "$id" sh -ec '
    containerd >/var/log/containerd-build.log 2>&1 &
    pid=$!
    for _ in $(seq 60); do ctr version >/dev/null 2>&1 && break; sleep 0.5; done
    ctr -n k8s.io images import --label=io.cri-containerd.pinned=pinned --all-platforms \
      --no-unpack --digests /images.tar >/dev/null
    ctr -n k8s.io images ls -q | grep -v "^import-" | grep -v "^sha256:"
    kill "$pid"; wait "$pid" || true
    rm -f /var/log/containerd-build.log' >&2
  docker commit --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' "$id" "$image" >/dev/null
  docker rm -f "$id" >/dev/null
}

node_stage() {  # NODE_BASE K8S_VERSION TAG
  DOCKER_BUILDKIT=1 docker build -q --network=host -f "$HERE/kind/node.Dockerfile" \
    --build-arg "NODE_BASE=$1" --build-arg "K8S_VERSION=$2" -t "$3" "$WORK/context" >/dev/null
}

main() {
  "$HERE/build.sh" >&2
  "$HERE/build.sh" kind >&2
  "$HERE/dockerd.sh"
  mkdir -p "$WORK"
  exec 9>"$WORK/build.lock"
  flock 9
  local k8s key image node_base net_base
  k8s=$(version kubeadm)
  key=$( (cat "$0" "$HERE"/kind/* "$HERE/runc-without-sys-resource" "$HERE/pause.c"; cat "$BIN"/.*.version) | sha256sum | cut -c1-12)
  image="$REPO/kind-node:$k8s-$key"
  if docker image inspect "$image" >/dev/null 2>&1; then
    log "reusing $image"
    echo "$image"
    return
  fi
  timed "node base (mmdebstrap)" eval 'node_base=$(debian_base node "$NODE_PACKAGES")'
  timed "network base (mmdebstrap)" eval 'net_base=$(debian_base net "$NET_PACKAGES")'
  timed "component images" build_images "$k8s" "$net_base"
  timed "node files" context "$WORK/context"
  timed "node image" node_stage "$node_base" "$k8s" "$image-stage"
  timed "images into the node's containerd" commit_node "$image-stage" "$image"
  docker rmi "$image-stage" >/dev/null
  # Earlier builds, unless a node still runs one.
  docker images --format '{{.Repository}}:{{.Tag}}' "$REPO/kind-node" | grep -vxF "$image" \
    | xargs -r docker rmi >/dev/null 2>&1 || true
  printf '%s\n' "${STEPS[@]}" >&2
  echo "$image"
}

main "$@"

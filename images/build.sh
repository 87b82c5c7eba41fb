#!/usr/bin/env bash
# Builds the operator and trainer images, and the plain TensorFlow example's (examples/plain-tf),
# on a machine that reaches no container registry: a Debian base made here with mmdebstrap (reused
# while its inputs are unchanged), the operator on it, TensorFlow on it (images/tensorflow: what the
# official tensorflow/tensorflow image is elsewhere), and the trainer and the example on that, with
# the host's CA bundle as a BuildKit secret (for a TLS-intercepting proxy in front of PyPI).
#   images/build.sh         build (or reuse) the base and the images
#   images/build.sh kueue   the base and Kueue's image only (images/kueue/Dockerfile), from its
#                           manager, which `e2e/cluster/build.sh kueue` builds if not cached: for
#                           the tests that install Kueue (e2e/real/kueue.py) and CI, not the demo
#   images/build.sh seaweedfs  the base and SeaweedFS's image only (images/seaweedfs/Dockerfile),
#                           the S3-compatible store of the s3:// checkpoint tests
#                           (e2e/real/objectstore.py), from `e2e/cluster/build.sh seaweedfs`'s weed
# Progress goes to stderr, ending with a table of each step's seconds and each image's size.
# Environment: PSOPERATOR_CACHE (~/.cache/psoperator), PSOPERATOR_OPERATOR_IMAGE,
# PSOPERATOR_TRAINER_IMAGE, PSOPERATOR_PLAIN_TF_IMAGE and PSOPERATOR_KUEUE_IMAGE (the tags),
# KUEUE_VERSION (e2e/cluster/build.sh's), PSOPERATOR_TENSORFLOW (the pip requirement of the
# TensorFlow image), PSOPERATOR_CACERT (the CA bundle given as secret), DOCKER.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
. e2e/packages.sh

# The image names e2e/real reads from the same variables.
OPERATOR_IMAGE=${PSOPERATOR_OPERATOR_IMAGE:-ps-training-operator:dev}
TRAINER_IMAGE=${PSOPERATOR_TRAINER_IMAGE:-ps-training-operator/trainer:dev}
PLAIN_TF_IMAGE=${PSOPERATOR_PLAIN_TF_IMAGE:-ps-training-operator/plain-tf:dev}
KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
KUEUE_IMAGE=${PSOPERATOR_KUEUE_IMAGE:-ps-training-operator/kueue:$KUEUE_VERSION}
SEAWEEDFS_IMAGE=${PSOPERATOR_SEAWEEDFS_IMAGE:-ps-training-operator/seaweedfs:dev}
TENSORFLOW=${PSOPERATOR_TENSORFLOW:-tensorflow-cpu==2.21.0}
CACERT=${PSOPERATOR_CACERT:-/etc/ssl/certs/ca-certificates.crt}
CACHE=${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}/images
BIN=${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}/bin
# A docker client newer than the daemon and without the buildx plugin cannot build with BuildKit;
# the distribution's client, when there is one, matches the distribution's daemon.
if [ -z "${DOCKER:-}" ]; then
  if [ -x /usr/bin/docker ]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi
fi

# The base: Debian with Python 3.11, its venv module and pip (the Dockerfiles install into a venv,
# since Debian's Python is externally managed), without documentation. Its tag is a hash of
# everything that makes it, so a change here makes a new base and an unchanged one is reused.
MMDEBSTRAP_ARGS=(
  --variant=minbase --format=tar
  --include=python3,python3-venv,python3-pip,ca-certificates
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  bookworm
)
# docker import sets no PATH: without one, the Dockerfiles' PATH=/opt/venv/bin:$PATH would hide /bin.
IMPORT_CHANGES=(
  'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
  'ENV LANG=C.UTF-8'
  'CMD ["python3"]'
)
BASE_KEY=$(printf '%s\n' "${MMDEBSTRAP_ARGS[@]}" "${IMPORT_CHANGES[@]}" | sha256sum | cut -c1-12)
BASE_IMAGE=psoperator/base:bookworm-$BASE_KEY
BASE_TAR=$CACHE/base-bookworm-$BASE_KEY.tar
TF_IMAGE=psoperator/tensorflow:dev

log() { printf '[images/build.sh %s] %s\n' "$(date +%T)" "$*" >&2; }

STEPS=()
SECONDS_TAKEN=()
# timed NAME COMMAND...: runs COMMAND and records its wall time under NAME for the final table.
timed() {
  local name=$1 start=$EPOCHREALTIME
  shift
  "$@"
  STEPS+=("$name")
  SECONDS_TAKEN+=("$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')")
}

make_base() {
  if "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    log "reusing $BASE_IMAGE"
    return
  fi
  if [ ! -s "$BASE_TAR" ]; then
    need_command mmdebstrap
    log "mmdebstrap bookworm into $BASE_TAR (a minute or two)"
    trap 'rm -f "$BASE_TAR.part"' EXIT
    mmdebstrap "${MMDEBSTRAP_ARGS[@]}" "$BASE_TAR.part" >&2
    mv "$BASE_TAR.part" "$BASE_TAR"
    trap - EXIT
  fi
  log "importing $BASE_TAR as $BASE_IMAGE"
  local change=()
  for c in "${IMPORT_CHANGES[@]}"; do change+=(--change "$c"); done
  "$DOCKER" import "${change[@]}" "$BASE_TAR" "$BASE_IMAGE" >&2
}

BUILT=()
# build_image TAG DOCKERFILE CONTEXT [BUILD OPTIONS...]: the daemon runs with no bridge, hence
# --network=host.
build_image() {
  local tag=$1 dockerfile=$2 context=$3
  shift 3
  local secret=()
  if [ -r "$CACERT" ]; then secret=(--secret "id=cacert,src=$CACERT"); fi
  log "building $tag from $dockerfile"
  DOCKER_BUILDKIT=1 "$DOCKER" build --network=host --progress=plain "${secret[@]}" "$@" \
    -f "$dockerfile" -t "$tag" "$context" >&2
  BUILT+=("$tag")
}

# Kueue's manager, built (or found) in the binary cache, copied onto the base.
build_kueue_image() {
  KUEUE_VERSION=$KUEUE_VERSION e2e/cluster/build.sh kueue >&2
  build_image "$KUEUE_IMAGE" images/kueue/Dockerfile "$BIN" --build-arg "BASE_IMAGE=$BASE_IMAGE"
}

# SeaweedFS's weed, built (or found) in the binary cache, copied onto the base.
build_seaweedfs_image() {
  e2e/cluster/build.sh seaweedfs >&2
  build_image "$SEAWEEDFS_IMAGE" images/seaweedfs/Dockerfile "$BIN" --build-arg "BASE_IMAGE=$BASE_IMAGE"
}

megabytes() { awk -v b="$1" 'BEGIN { printf "%.0f MB", b / 1e6 }'; }

report() {
  {
    printf '\n%-60s %10s\n' step seconds
    for i in "${!STEPS[@]}"; do printf '%-60s %10s\n' "${STEPS[$i]}" "${SECONDS_TAKEN[$i]}"; done
    printf '\n%-60s %10s\n' image size
    for tag in "$BASE_IMAGE" "${BUILT[@]}"; do
      printf '%-60s %10s\n' "$tag" "$(megabytes "$("$DOCKER" image inspect -f '{{.Size}}' "$tag")")"
    done
  } >&2
}

case ${1:-build} in
  build | kueue | seaweedfs) ;;
  *)
    echo "usage: $0 [build|kueue|seaweedfs]" >&2
    exit 2
    ;;
esac

# A Docker daemon (Debian's dockerd, started if none answers).
e2e/cluster/dockerd.sh

# One run at a time (the demo and the tests call this too): they would share the base's tarball.
mkdir -p "$CACHE"
exec 9>"$CACHE/build.lock"
flock 9

timed "base $BASE_IMAGE" make_base
if [ "${1:-build}" = kueue ]; then
  timed "kueue $KUEUE_IMAGE" build_kueue_image
  report
  exit 0
fi
if [ "${1:-build}" = seaweedfs ]; then
  timed "seaweedfs $SEAWEEDFS_IMAGE" build_seaweedfs_image
  report
  exit 0
fi
timed "operator $OPERATOR_IMAGE" build_image "$OPERATOR_IMAGE" Dockerfile . \
  --build-arg "PYTHON_IMAGE=$BASE_IMAGE"
timed "tensorflow $TF_IMAGE" build_image "$TF_IMAGE" images/tensorflow/Dockerfile images/tensorflow \
  --build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "TENSORFLOW=$TENSORFLOW"
timed "trainer $TRAINER_IMAGE" build_image "$TRAINER_IMAGE" images/trainer/Dockerfile . \
  --build-arg "TF_IMAGE=$TF_IMAGE"
timed "plain TensorFlow example $PLAIN_TF_IMAGE" build_image "$PLAIN_TF_IMAGE" examples/plain-tf/Dockerfile \
  examples/plain-tf --build-arg "TF_IMAGE=$TF_IMAGE"
report

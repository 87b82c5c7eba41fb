#!/usr/bin/env bash
# Starts Debian's dockerd if no Docker daemon answers (installing docker.io if needed), for image
# builds and `docker save` only: no bridge and no iptables rules, so it changes nothing in this
# machine's networking (builds run with --network=host; kind's nodes are on a network of their own,
# with no NAT to the outside). Idempotent; its log goes to the cache.
# On a host whose capability bounding set lacks CAP_SYS_RESOURCE, runc-without-sys-resource (copied
# into the cache, so that it outlives the checkout) is the default runtime: `docker run --privileged`,
# as kind runs its nodes, then starts.
set -euo pipefail
CACHE="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}"
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=docker

. "$(dirname "$0")/../packages.sh"

"$DOCKER" info >/dev/null 2>&1 && exit 0
if ! command -v dockerd >/dev/null; then
  need_packages docker.io
  DOCKER=/usr/bin/docker
fi
mkdir -p "$CACHE/logs" "$CACHE/bin"
runtime=()
# CAP_SYS_RESOURCE is capability 24.
if (( (16#$(awk '/^CapBnd:/ {print $2}' /proc/self/status) >> 24 & 1) == 0 )); then
  need_command jq  # the wrapper edits the container's config with it
  install -m 0755 "$(dirname "$0")/runc-without-sys-resource" "$CACHE/bin/"
  runtime=(--add-runtime "psoperator-runc=$CACHE/bin/runc-without-sys-resource"
    --default-runtime psoperator-runc)
fi
printf '[dockerd %s] starting dockerd (log: %s)\n' "$(date +%T)" "$CACHE/logs/dockerd.log" >&2
# setsid and 9>&-: it outlives this script and holds no caller's lock.
setsid dockerd --iptables=false --bridge=none "${runtime[@]}" >>"$CACHE/logs/dockerd.log" 2>&1 < /dev/null 9>&- &
for _ in $(seq 120); do
  "$DOCKER" info >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "dockerd did not start: see $CACHE/logs/dockerd.log" >&2
exit 1

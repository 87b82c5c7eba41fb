#!/usr/bin/env bash
# Starts Debian's dockerd if no Docker daemon answers (installing docker.io if needed), for image
# builds and `docker save` only: no bridge and no iptables rules, so it changes nothing in this
# machine's networking (builds run with --network=host). Idempotent; its log goes to the cache.
set -euo pipefail
CACHE="${PSOPERATOR_CACHE:-$HOME/.cache/psoperator}"
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=docker

"$DOCKER" info >/dev/null 2>&1 && exit 0
if ! command -v dockerd >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
  DOCKER=/usr/bin/docker
fi
mkdir -p "$CACHE/logs"
printf '[dockerd %s] starting dockerd (log: %s)\n' "$(date +%T)" "$CACHE/logs/dockerd.log" >&2
# setsid and 9>&-: it outlives this script and holds no caller's lock.
setsid dockerd --iptables=false --bridge=none >>"$CACHE/logs/dockerd.log" 2>&1 < /dev/null 9>&- &
for _ in $(seq 120); do
  "$DOCKER" info >/dev/null 2>&1 && exit 0
  sleep 0.5
done
echo "dockerd did not start: see $CACHE/logs/dockerd.log" >&2
exit 1

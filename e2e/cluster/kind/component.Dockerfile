# kube-proxy or kube-router, built here, on a Debian base with iptables, ipset and conntrack, for
# the kind node image (kindnode.sh). Their manifests give the command.
ARG BASE
FROM ${BASE}
ARG BINARY
COPY ${BINARY} /usr/local/bin/${BINARY}

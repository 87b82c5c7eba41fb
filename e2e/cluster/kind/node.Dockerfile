# A kind node on the Debian base kindnode.sh makes (systemd, containerd, runc, the CNI plugins):
# kind's own node files from its Go module, the Kubernetes binaries built here, this directory's
# containerd config and CNI manifest. kindnode.sh then imports the images kubeadm runs.
ARG NODE_BASE
FROM ${NODE_BASE}
COPY kind-base/usr/local/bin/ /usr/local/bin/
COPY kind-base/kind/ /kind/
COPY kind-base/etc/ /etc/
COPY containerd.toml /etc/containerd/config.toml
COPY runc-without-sys-resource /usr/local/bin/
COPY bin/ /usr/bin/
COPY kube-router.yaml /kind/manifests/default-cni.yaml
ARG K8S_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# cri-base.json is containerd's default spec with kind's product-files hook and no rlimits, as
# kind's base image makes it; kind's unit starts containerd from /usr/local/bin; the CNI plugins
# go where containerd looks for them.
RUN chmod 0755 /usr/local/bin/* /kind/bin/* \
    /usr/bin/kubeadm /usr/bin/kubelet /usr/bin/kubectl /usr/bin/crictl \
 && ctr oci spec \
    | jq '.hooks.createContainer += [{"path": "/kind/bin/mount-product-files.sh"}] | del(.process.rlimits)' \
    > /etc/containerd/cri-base.json \
 && ln -s /usr/bin/containerd /usr/local/bin/containerd \
 && mkdir -p /opt/cni/bin /etc/kubernetes/manifests \
 && cp /usr/lib/cni/* /opt/cni/bin/ \
 && echo "$K8S_VERSION" > /kind/version \
 && find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete \
 && rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
    /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
    /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/* \
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \
 && systemctl mask systemd-binfmt.service
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]

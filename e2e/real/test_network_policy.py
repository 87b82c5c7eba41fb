"""The jobs' NetworkPolicies enforced on the real node: the CNI bridge plugin enforces none, so SIG
Network's kube-network-policies (built by e2e/cluster/build.sh, nftables and nfqueue) runs on the
node for this module. The example trains for real; a pod of another namespace cannot connect to a
parameter server's gRPC port nor to the chief's progress port, while a worker of the job connects
and the operator (in its own namespace) reads the progress; with spec.networkPolicy.enabled false
the same pod connects. It needs a kernel with the nftables queue (nft_queue, nfnetlink_queue): the
development machine's does not have one (`nft add rule ... queue num 1` answers "No such file or
directory"), so there the test skips and says so.
"""

from __future__ import annotations

import base64
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client

from e2e import psjobs
from e2e.kubectl import _kubectl, kubectl
from e2e.operator_process import _http_ok
from e2e.paths import CACHE
from e2e.real import example
from e2e.real.conftest import LOGS, OPERATOR_IMAGE, Figures
from e2e.util import as_json, free_port, unavailable, wait_for

ENFORCER = CACHE / "bin" / "kube-network-policies"
ENFORCER_LOG = LOGS / "kube-network-policies.log"
ACCOUNT, ACCOUNT_NS = "kube-network-policies", "kube-system"
SECRETS = "/var/run/secrets/kubernetes.io/serviceaccount"
STEPS = 1_000_000  # trains for as long as the test probes
RBAC = f"""
apiVersion: v1
kind: ServiceAccount
metadata: {{name: {ACCOUNT}, namespace: {ACCOUNT_NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {ACCOUNT}}}
rules:
- apiGroups: [""]
  resources: [pods, namespaces, nodes]
  verbs: [get, list, watch]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {ACCOUNT}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {ACCOUNT}}}
subjects: [{{kind: ServiceAccount, name: {ACCOUNT}, namespace: {ACCOUNT_NS}}}]
"""
# v0.8.0 reads only the in-cluster configuration (no --kubeconfig): a private mount namespace gives
# it one, with a tmpfs over /run so that the host's /run is left as it is.
IN_CLUSTER = f'mount -t tmpfs tmpfs /run && mkdir -p {SECRETS} && cp "$1"/* {SECRETS}/ && shift && exec "$@"'


def _secrets(kubeconfig: Path, directory: Path) -> dict[str, str]:
    """The account's token and the cluster's CA as a pod would see them; the in-cluster environment."""
    kubectl(kubeconfig, "apply", "-f", "-", stdin=RBAC)
    token = kubectl(kubeconfig, "create", "token", ACCOUNT, "-n", ACCOUNT_NS, "--duration", "2h").strip()
    cluster = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(token)
    inline = cluster.get("certificate-authority-data")  # kwokctl's kubeconfig names a file instead
    ca = base64.b64decode(inline) if inline else Path(cluster["certificate-authority"]).read_bytes()
    (directory / "ca.crt").write_bytes(ca)
    (directory / "namespace").write_text(ACCOUNT_NS)
    server = urlparse(cluster["server"])
    return {"KUBERNETES_SERVICE_HOST": str(server.hostname), "KUBERNETES_SERVICE_PORT": str(server.port)}


# kube-network-policies sends new connections to userspace through an nftables queue; a probe in a
# throwaway network namespace tells whether this kernel has one (the host's rules stay untouched).
QUEUE_PROBE = (
    "nft add table inet probe && "
    "nft add chain inet probe c '{ type filter hook forward priority 0; }' && "
    "nft add rule inet probe c queue num 1 bypass"
)


def _kernel_cannot_queue() -> str | None:
    result = subprocess.run(
        ["unshare", "--net", "sh", "-c", QUEUE_PROBE], capture_output=True, text=True, timeout=30, check=False
    )
    return None if result.returncode == 0 else result.stderr.strip().splitlines()[0]


@pytest.fixture(scope="module")
def enforcer(
    kubeconfig: Path, k8s: client.ApiClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """kube-network-policies on the node for this module's tests, stopped (its table removed) after."""
    refused = _kernel_cannot_queue()
    if refused:  # the host's kernel, not a missing install: nothing to fix here (nor built)
        pytest.skip(f"this kernel has no nftables queue, which kube-network-policies needs: {refused}")
    if not ENFORCER.exists():
        unavailable(f"{ENFORCER} is not built (e2e/cluster/cluster.sh build)")
    secrets = tmp_path_factory.mktemp("enforcer")
    env = {**os.environ, **_secrets(kubeconfig, secrets)}
    [node] = [n["metadata"]["name"] for n in as_json(k8s, client.CoreV1Api(k8s).list_node())["items"]]
    port = free_port()
    command = [
        "unshare", "--mount", "--propagation", "private", "sh", "-c", IN_CLUSTER, "sh", str(secrets),
        str(ENFORCER), f"--hostname-override={node}", "--disable-nri",
        f"--metrics-bind-address=127.0.0.1:{port}",
    ]  # fmt: skip
    LOGS.mkdir(parents=True, exist_ok=True)
    with ENFORCER_LOG.open("w") as log:
        process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    try:
        wait_for(
            lambda: process.poll() is None and _http_ok(f"http://127.0.0.1:{port}/metrics"),
            timeout=60,
            message=lambda: f"kube-network-policies serving; its log: {ENFORCER_LOG.read_text()[-3000:]}",
        )
        yield
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def outsider(k8s: client.ApiClient, kubeconfig: Path) -> Iterator[tuple[str, str]]:
    """A pod in a namespace of its own (the operator's image: it has Python), as (namespace, pod)."""
    namespace = f"e2e-outsider-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(k8s)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "outsider"},
        "spec": {
            "containers": [
                {
                    "name": "probe",
                    "image": OPERATOR_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", "import time; time.sleep(3600)"],
                }
            ]
        },
    }
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(pod))
    kubectl(kubeconfig, "wait", "-n", namespace, "--for=condition=Ready", "pod/outsider", "--timeout=120s")
    yield namespace, "outsider"
    core.delete_namespace(namespace)


def _connects(kubeconfig: Path, namespace: str, pod: str, container: str, ip: str, port: int) -> bool:
    """Whether a TCP connection from inside the pod to ip:port is established within 3 s."""
    probe = f"import socket; socket.create_connection(({ip!r}, {port}), timeout=3).close()"
    result = subprocess.run(
        [_kubectl(), "--kubeconfig", str(kubeconfig), "exec", "-n", namespace, pod, "-c", container, "--",
         "python", "-c", probe],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return result.returncode == 0


@pytest.mark.usefixtures("enforcer")
def test_another_namespace_cannot_reach_the_ps_while_a_worker_and_the_operator_can(
    kubeconfig: Path,
    k8s: client.ApiClient,
    namespace: str,
    release: str,
    outsider: tuple[str, str],
    figures: Figures,
) -> None:
    docs = example.manifests(namespace, STEPS)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    name = str(next(d["metadata"]["name"] for d in docs if d["kind"] == "PSTrainingJob"))
    # The operator, in its own namespace, reads the chief's progress: the step advances.
    wait_for(
        lambda: (psjobs.status(k8s, namespace, name).get("step") or 0) > 0,
        timeout=300,
        interval=1,
        message=lambda: f"status.step read by the operator; {psjobs.status(k8s, namespace, name)}",
    )
    ps = psjobs.running_pod(k8s, namespace, name, "ps", 0)
    chief = psjobs.running_pod(k8s, namespace, name, "chief")
    worker = psjobs.running_pod(k8s, namespace, name, "worker", 0)
    ps_ip, chief_ip = ps["status"]["podIP"], chief["status"]["podIP"]
    other_ns, other = outsider

    assert _connects(kubeconfig, namespace, worker["metadata"]["name"], "trainer", ps_ip, 2222)
    assert not _connects(kubeconfig, other_ns, other, "probe", ps_ip, 2222)
    assert not _connects(kubeconfig, other_ns, other, "probe", chief_ip, 8470)
    figures.record("NetworkPolicy: another namespace → PS gRPC", "refused")

    # The policies, not something else, keep it out: switched off, the same pod gets in.
    psjobs.patch_spec(k8s, namespace, name, {"networkPolicy": {"enabled": False}})
    wait_for(
        lambda: _connects(kubeconfig, other_ns, other, "probe", ps_ip, 2222),
        timeout=60,
        interval=2,
        message="the outsider connects once the job's policies are switched off",
    )
    figures.record("NetworkPolicy off: another namespace → PS gRPC", "connected")
    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, namespace, psjobs.PLURAL, name
    )

"""Kubeflow's training-operator v1 (TFJob), the benchmark's peer: built from the Go module proxy
(`e2e/cluster/build.sh training-operator`), run as a process on this host against the local control
plane, with what its standalone manifests give it in a cluster:

- the TFJob CRD, the `kubeflow` namespace, its ServiceAccount bound to its own ClusterRole (all
  three read from the module's `manifests/base`), so that it runs with its own RBAC and the API
  server counts its requests apart;
- the Secret `training-operator-webhook-cert`, which its cert rotator fills and checks at start, and
  the ValidatingWebhookConfiguration the rotator patches with its CA; the API server calls the
  TFJob webhook on every create (failurePolicy Fail, as installed), so the webhook is served.

It serves the webhook at `https://127.0.0.1:PORT` (no Service reaches a process on this host). The
rotator would sign a certificate for its Service's DNS name only, which the API server, calling an
IP, would refuse; so the Secret is filled beforehand with a CA and a certificate the rotator accepts
as its own (it checks the CA's name and the certificate against that DNS name) and that also names
127.0.0.1. In a cluster the kubelet mounts that Secret where the webhook server reads it (a path
fixed in its source); here the benchmark writes the files there.

All of it stays in the cluster after the run (the next start applies it again): with the process
stopped, the API server refuses TFJob creates (failurePolicy Fail), and nothing else.
"""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from kubernetes import client

from e2e.accounts import token_kubeconfig
from e2e.bench.podwatch import PodLabels
from e2e.kubectl import kubectl
from e2e.operator_process import OperatorProcess
from e2e.paths import CACHE, REPO
from e2e.psjobs import IMAGE
from e2e.util import free_port

MODULE = "github.com/kubeflow/training-operator"
BINARY = CACHE / "bin" / "training-operator"
NAMESPACE = "kubeflow"  # its default (MY_POD_NAMESPACE unset)
ACCOUNT = "training-operator"
SECRET = "training-operator-webhook-cert"
WEBHOOK_CONFIGURATION = "validator.training-operator.kubeflow.org"  # the name its rotator patches
SERVICE_DNS = "training-operator.kubeflow.svc"  # the name its rotator checks the certificate against
CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # fixed in its source (pkg/cert)
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "tfjobs"
# Its pods' labels; the replica type is lower-cased ("chief", "ps", "worker"); no attempt.
LABELS = PodLabels("training.kubeflow.org/job-name", "training.kubeflow.org/replica-type")

Obj = dict[str, Any]


def tfjob_manifest(name: str, ps: int, workers: int) -> Obj:
    """The benchmark's job as a TFJob: the container named as it requires ("tensorflow"), the
    image of ours (KWOK's stages run it), and OnFailure, under which it replaces any Failed pod
    (under ExitCode, a PS exiting with 1 fails the job; under Never, any failure does)."""

    def replicas(count: int) -> Obj:
        container = {"name": "tensorflow", "image": IMAGE}
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [container]}},
        }

    specs = {"Chief": replicas(1), "PS": replicas(ps), "Worker": replicas(workers)}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TFJob", "metadata": {"name": name},
            "spec": {"tfReplicaSpecs": specs}}  # fmt: skip


def create_tfjob(api: client.ApiClient, namespace: str, body: Obj) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def all_running(api: client.ApiClient, namespace: str) -> bool:
    """Every TFJob of the namespace has its Running condition."""
    listed: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL
    )
    return all(
        any(
            c.get("type") == "Running" and c.get("status") == "True"
            for c in item.get("status", {}).get("conditions", [])
        )
        for item in listed["items"]
    )


def build() -> Path:
    """The binary, built on first use (several minutes), then cached."""
    subprocess.run([str(REPO / "e2e" / "cluster" / "build.sh"), "training-operator"], check=True)
    return BINARY


def module_dir() -> Path:
    """The source of the version build.sh built, from the Go module cache: its manifests."""
    version = (BINARY.parent / ".training-operator.version").read_text().strip()
    listed = subprocess.run(
        ["go", "mod", "download", "-json", f"{MODULE}@{version}"],
        capture_output=True, text=True, check=True, cwd=tempfile.gettempdir(), timeout=300,
    ).stdout  # fmt: skip
    return Path(json.loads(listed)["Dir"])


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, capture_output=True, check=True, timeout=60)


def make_certificates(directory: Path) -> dict[str, bytes]:
    """The Secret's data: a CA named as the rotator names its own (PKCS#1 keys, as it parses them),
    and a serving certificate valid for a year for the Service's DNS name and 127.0.0.1."""
    _openssl(directory, "genrsa", "-traditional", "-out", "ca.key", "2048")
    _openssl(directory, "req", "-x509", "-new", "-key", "ca.key", "-out", "ca.crt", "-days", "3650",
             "-subj", "/O=training-operator/CN=training-operator-ca",
             "-addext", "subjectAltName=DNS:training-operator-ca")  # fmt: skip
    _openssl(directory, "genrsa", "-traditional", "-out", "tls.key", "2048")
    _openssl(directory, "req", "-x509", "-new", "-key", "tls.key", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-out", "tls.crt", "-days", "365", "-subj", f"/CN={SERVICE_DNS}",
             "-addext", f"subjectAltName=DNS:{SERVICE_DNS},IP:127.0.0.1",
             "-addext", "extendedKeyUsage=serverAuth",
             "-addext", "basicConstraints=critical,CA:FALSE")  # fmt: skip
    return {name: (directory / name).read_bytes() for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")}


def _account_manifests(source: Path) -> list[Obj]:
    """Its ServiceAccount, ClusterRole and ClusterRoleBinding (kustomize would set the namespace)."""
    rbac = source / "manifests" / "base" / "rbac"
    objects = [yaml.safe_load((rbac / f).read_text()) for f in ("service-account.yaml", "role.yaml")]
    binding = yaml.safe_load((rbac / "cluster-role-binding.yaml").read_text())
    binding["subjects"] = [{**s, "namespace": NAMESPACE} for s in binding["subjects"]]
    objects[0]["metadata"]["namespace"] = NAMESPACE
    return [*objects, binding]


def _secret(data: dict[str, bytes]) -> Obj:
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "type": "Opaque", "data": encoded}  # fmt: skip


def install(kubeconfig: Path, workdir: Path) -> tuple[Path, bytes]:
    """Everything but the webhook configuration; returns its account's kubeconfig and the CA."""
    source = module_dir()
    kubectl(kubeconfig, "apply", "--server-side", "-f",
            str(source / "manifests" / "base" / "crds" / "kubeflow.org_tfjobs.yaml"))  # fmt: skip
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    data = make_certificates(workdir)
    objects = [namespace, *_account_manifests(source), _secret(data)]
    kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump_all(objects))
    CERT_DIR.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        (CERT_DIR / name).write_bytes(data[name])
    return token_kubeconfig(kubeconfig, NAMESPACE, ACCOUNT, workdir / "peer-kubeconfig"), data["ca.crt"]


def webhook_configuration(port: int, ca: bytes) -> Obj:
    """The TFJob webhook of its manifests (manifests/base/webhook), called at this host's port."""
    url = f"https://127.0.0.1:{port}/validate-kubeflow-org-v1-tfjob"
    rule = {"apiGroups": ["kubeflow.org"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
            "resources": ["tfjobs"]}  # fmt: skip
    webhook = {
        "name": "validator.tfjob.training-operator.kubeflow.org",
        "admissionReviewVersions": ["v1"],
        "clientConfig": {"url": url, "caBundle": base64.b64encode(ca).decode()},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "rules": [rule],
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": WEBHOOK_CONFIGURATION},
        "webhooks": [webhook],
    }


class PeerProcess(OperatorProcess):
    """The training-operator with the TFJob controller only, as its account, on free ports; ready
    when its readiness endpoint answers (certificates in place, the CA injected, the webhook
    served)."""

    probe_path = "/readyz"

    def __init__(self, kubeconfig: Path, log_path: Path, metrics_port: int) -> None:
        super().__init__(kubeconfig, "", log_path)
        self.metrics_port, self.webhook_port = metrics_port, free_port()
        self.extra_env = {"TMPDIR": "/tmp"}  # where its webhook server looks for CERT_DIR

    def command(self) -> list[str]:
        return [
            str(BINARY), "--enable-scheme=tfjob",
            f"--health-probe-bind-address={urlsplit(self.liveness_url).netloc}",
            f"--metrics-bind-address=127.0.0.1:{self.metrics_port}",
            f"--webhook-server-port={self.webhook_port}",
        ]  # fmt: skip


def start(admin_kubeconfig: Path, workdir: Path) -> PeerProcess:
    """Builds (once), installs and starts it; the caller stops it. Its log: workdir/peer.log."""
    build()
    kubeconfig, ca = install(admin_kubeconfig, workdir)
    peer = PeerProcess(kubeconfig, workdir / "peer.log", free_port())
    body = yaml.safe_dump(webhook_configuration(peer.webhook_port, ca))
    kubectl(admin_kubeconfig, "apply", "-f", "-", stdin=body)
    peer.start(timeout=120)
    return peer

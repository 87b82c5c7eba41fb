"""An S3-compatible store in the kind cluster, for the tests of s3:// checkpoints: SeaweedFS's
`weed server` with its S3 gateway (images/seaweedfs, built from the Go module proxy), in its own
namespace, with one identity and the tests' bucket created at start. Its data is an emptyDir: the
store lives as long as its pod.

    install(kubeconfig) -> Store     the image built and loaded, the Deployment Available, the bucket made
    apply_on_s3(...)                 the example job with its checkpoints in the bucket
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.kubectl import kubectl
from e2e.real import example
from e2e.real.commands import BUILD_IMAGES, load, run
from e2e.util import wait_for

IMAGE = os.environ.get("PSOPERATOR_SEAWEEDFS_IMAGE", "ps-training-operator/seaweedfs:dev")
NAMESPACE = "psoperator-s3"
NAME = "seaweedfs"
PORT = 8333
BUCKET = "ctr-checkpoints"
# The store's only identity: test credentials of this cluster's own store, nothing real.
ACCESS_KEY = "psoperator-e2e"
SECRET_KEY = "e2e-secret-of-the-in-cluster-store"
SECRET = "ctr-s3"  # a job's Secret of its credentials
Obj = dict[str, Any]


@dataclass(frozen=True)
class Store:
    endpoint: str
    bucket: str

    def secret(self, name: str, secret_key: str = SECRET_KEY) -> Obj:
        """A Secret for a job's namespace, under the keys spec.checkpoint.s3.credentialsSecret reads."""
        data = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": secret_key}
        return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data}

    def checkpoint(self, run: str, secret: str, bucket: str | None = None) -> Obj:
        """spec.checkpoint for a job writing to s3://<bucket>/<run>."""
        return {
            "dir": f"s3://{bucket or self.bucket}/{run}",
            "s3": {
                "endpoint": self.endpoint,
                "addressingStyle": "path",
                "credentialsSecret": {"name": secret},
            },
        }


def apply_on_s3(
    kubeconfig: Path,
    namespace: str,
    store: Store,
    run: str,
    steps: int,
    bucket: str | None = None,
    secret_key: str = SECRET_KEY,
    args: tuple[str, ...] = (),
    evaluator: bool = True,
) -> str:
    """Apply the example job (its claim left out) with its checkpoints in s3://<bucket>/<run>, and the
    Secret it names; `args` added to its chief's. Its name."""
    job = next(d for d in example.example_manifests(steps) if d["kind"] == "PSTrainingJob")
    spec = job["spec"]
    if not evaluator:
        del spec["evaluator"]
    spec["checkpoint"] = {**store.checkpoint(run, SECRET, bucket), "intervalSteps": example.CHECKPOINT_STEPS}
    chief = spec["chief"]["template"]["spec"]["containers"][0]
    chief["args"] = [*chief["args"], *args]
    docs = [store.secret(SECRET, secret_key), job]
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    return str(job["metadata"]["name"])


def _restricted() -> Obj:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def manifests() -> list[Obj]:
    identities = {
        "identities": [
            {
                "name": "e2e",
                "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                "actions": ["Admin"],
            }
        ]
    }
    labels = {"app.kubernetes.io/name": NAME}
    args = [
        "server", "-dir=/data", "-ip=127.0.0.1", "-ip.bind=0.0.0.0", "-volume.max=0",
        "-master.volumeSizeLimitMB=256", "-filer", "-s3", f"-s3.port={PORT}", "-s3.config=/config/s3.json",
    ]  # fmt: skip
    container = {
        "name": NAME,
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "args": args,
        "ports": [{"name": "s3", "containerPort": PORT}],
        "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": _restricted(),
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "config", "mountPath": "/config"}],
    }
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{NAME}-s3-config"},
            "stringData": {"s3.json": json.dumps(identities)},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": NAME, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [container],
                        "volumes": [
                            {"name": "data", "emptyDir": {}},
                            {"name": "config", "secret": {"secretName": f"{NAME}-s3-config"}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": NAME, "labels": labels},
            "spec": {"selector": labels, "ports": [{"name": "s3", "port": PORT, "targetPort": PORT}]},
        },
    ]


def weed_shell(kubeconfig: Path, commands: str) -> str:
    """Commands of `weed shell` run in the store's pod (`fs.ls`, `s3.bucket.create`, ...)."""
    return kubectl(
        kubeconfig, "exec", "-i", "-n", NAMESPACE, f"deploy/{NAME}", "--",
        "weed", "shell", "-master=127.0.0.1:9333", stdin=commands + "\n", timeout=120,
    )  # fmt: skip


def objects(kubeconfig: Path, bucket: str, prefix: str) -> list[str]:
    """The names under s3://bucket/prefix/ (one level), as the store's filer lists them."""
    said = weed_shell(kubeconfig, f"fs.ls /buckets/{bucket}/{prefix}")
    return sorted(line.strip() for line in said.splitlines() if line.strip() and not line.startswith(">"))


def install(kubeconfig: Path) -> tuple[Store, dict[str, float]]:
    """Build and load the image, run the store, make the bucket; the seconds each step took."""
    took: dict[str, float] = {}
    started = time.monotonic()
    run("bash", BUILD_IMAGES, "seaweedfs", timeout=2400, log="seaweedfs-build.log")
    took["SeaweedFS: weed and its image built"] = time.monotonic() - started
    started = time.monotonic()
    load(IMAGE, log="seaweedfs-load.log")
    took["SeaweedFS: image loaded into the workers"] = time.monotonic() - started
    started = time.monotonic()
    if not kubectl(kubeconfig, "get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name"):
        kubectl(kubeconfig, "create", "namespace", NAMESPACE)
    kubectl(
        kubeconfig,
        "label",
        "--overwrite",
        "namespace",
        NAMESPACE,
        "pod-security.kubernetes.io/enforce=restricted",
    )
    kubectl(kubeconfig, "apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump_all(manifests()))
    kubectl(kubeconfig, "rollout", "status", "-n", NAMESPACE, f"deploy/{NAME}", "--timeout=300s", timeout=320)

    def bucket_made() -> bool:
        """Made now or before (the store of an earlier run); false while its filer is not up."""
        try:
            said = weed_shell(kubeconfig, f"s3.bucket.create -name {BUCKET}")
        except AssertionError as refused:
            said = str(refused)
        return "already exists" in said or "error" not in said.lower()

    wait_for(bucket_made, timeout=120, message=f"bucket {BUCKET} created")
    took["SeaweedFS: running, bucket created"] = time.monotonic() - started
    return Store(endpoint=f"http://{NAME}.{NAMESPACE}.svc:{PORT}", bucket=BUCKET), took

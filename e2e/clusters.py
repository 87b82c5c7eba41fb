"""The cluster the e2e tests run against: reaching the one of KUBECONFIG or bringing up e2e/cluster's
(conftest's `kubeconfig`; util.unavailable when neither can be had), whether its nodes are KWOK's,
the PSTrainingJob CRD applied to it, and the names of the tests' namespaces."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path

import pytest
from kubernetes import client, config

from e2e.kubectl import _kubectl
from e2e.paths import REPO
from e2e.util import as_json, wait_for

CLUSTER_SH = REPO / "e2e" / "cluster" / "cluster.sh"
CRD_FILE = REPO / "crds" / "psoperator.io_pstrainingjobs.yaml"
CONTROL_PLANE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "kwokctl",
)
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
UP_TIMEOUT = 300.0


def reachable(kubeconfig: str) -> bool:
    try:
        api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except Exception:
        return False
    try:
        client.VersionApi(api).get_code(_request_timeout=5)
        return True
    except Exception:
        return False
    finally:
        api.close()


def cluster_sh(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def is_simulated(api: client.ApiClient) -> bool:
    """True when the cluster's nodes are KWOK's (no kubelet, no containers)."""
    nodes = [as_json(api, n) for n in client.CoreV1Api(api).list_node().items]
    return bool(nodes) and all(
        n["metadata"].get("annotations", {}).get(KWOK_NODE_ANNOTATION) == "fake" for n in nodes
    )


def apply_crd(kubeconfig: Path, k8s: client.ApiClient) -> str:
    """Applies crds/ server-side and waits until it is Established; returns its name."""
    if not CRD_FILE.exists():
        pytest.fail(
            f"{CRD_FILE.relative_to(REPO)} does not exist: the PSTrainingJob CRD has to be generated "
            "before the e2e tests can run",
            pytrace=False,
        )
    result = subprocess.run(
        [
            _kubectl(),
            "--kubeconfig",
            str(kubeconfig),
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            "psoperator-e2e",
            "-f",
            str(CRD_FILE),
            "-o",
            "name",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        pytest.fail(f"applying {CRD_FILE.name} failed:\n{result.stderr}", pytrace=False)
    name = result.stdout.strip().splitlines()[0].split("/", 1)[-1]
    ext = client.ApiextensionsV1Api(k8s)

    def established() -> bool:
        obj = ext.read_custom_resource_definition(name)
        conditions = (obj.status.conditions if obj.status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_for(established, timeout=60, message=f"CRD {name} Established")
    return name


def namespace_name(test_name: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"e2e-{stem}-{uuid.uuid4().hex[:6]}"

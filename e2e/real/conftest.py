"""Fixtures of the tests on real kubelets: the kind cluster of `e2e/cluster/kind.sh up` (three
nodes), the images built from the repository's Dockerfiles, and the operator installed with Helm.

  kubeconfig  (package)  overrides e2e's: the kind cluster, brought up once for e2e/real and taken
                         down after it (it would take CPU from the tests that follow)
  k8s         (package)  an API client for it
  images      (package)  the images built (images/build.sh) and loaded into the nodes
  release     (package)  `helm install` of the chart with the built operator image, in-cluster,
                         Pod Security `restricted` enforced on its namespace; Deployment Available
  figures     (session)  measured figures, printed as a table at the end of the run
  kueue       (package)  Kueue installed with its own chart (e2e/real/kueue.py), answering; its
                         namespace
  kueue_objects          Kueue objects a test creates (flavors, queues, workloads), deleted after it

These tests need root and Docker (kind's nodes are privileged containers); in CI they fail when
something is missing, elsewhere they skip.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from e2e.kubectl import kubectl
from e2e.paths import CACHE, REPO
from e2e.real.commands import BUILD_IMAGES, KIND_SH, helm, load, run
from e2e.real.example import PLAIN_TF_IMAGE, TRAINER_IMAGE
from e2e.real.kueue import NAMESPACE as KUEUE_NAMESPACE
from e2e.real.kueue import KueueObjects
from e2e.real.kueue import install as install_kueue
from e2e.real.objectstore import Store
from e2e.real.objectstore import install as install_store
from e2e.util import as_json, unavailable, wait_for

OPERATOR_IMAGE = os.environ.get("PSOPERATOR_OPERATOR_IMAGE", "ps-training-operator:dev")
RELEASE, RELEASE_NS = "psoperator", "psoperator-system"
CHART = REPO / "charts" / "ps-training-operator"
OPERATOR_PODS = "app.kubernetes.io/name=ps-training-operator"


class Figures:
    """Figures measured by the tests, printed together at the end of the session."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str]] = []

    def record(self, name: str, value: float | str, unit: str = "") -> None:
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        self.rows.append((name, f"{text} {unit}".strip()))

    def table(self) -> str:
        width = max((len(name) for name, _ in self.rows), default=0)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in self.rows)


FIGURES = Figures()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES.rows:
        terminalreporter.section("figures measured on real kubelets")
        terminalreporter.write_line(FIGURES.table())


@pytest.fixture(scope="session")
def figures() -> Figures:
    return FIGURES


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (kind's nodes are privileged containers)"
    for tool in ("dockerd", "containerd", "runc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install docker.io)"
    if not (CACHE / "bin" / "helm").exists():
        return "helm is not built (e2e/cluster/build.sh)"
    return None


@pytest.fixture(scope="package")
def kubeconfig() -> Iterator[Path]:
    reason = _missing()
    if reason:
        unavailable(f"e2e cluster unavailable: {reason}")
    started = time.monotonic()
    # The first run builds kind, kubeadm and the node image.
    path = Path(run("bash", KIND_SH, "up", timeout=1800, log="cluster-up.log").splitlines()[-1])
    FIGURES.record("kind cluster up (3 nodes)", time.monotonic() - started, "s")
    yield path
    if not os.environ.get("PSOPERATOR_KEEP_CLUSTER"):
        run("bash", KIND_SH, "down", timeout=300, log="cluster-down.log")


@pytest.fixture(scope="package")
def k8s(kubeconfig: Path) -> Iterator[client.ApiClient]:
    """Overrides e2e's too: a session fixture of the parent would keep the first cluster's client."""
    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    yield api
    api.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.real)


@pytest.fixture(scope="package")
def images(kubeconfig: Path) -> dict[str, str]:
    """The images, built here from the Dockerfiles and loaded into the nodes; their sizes recorded."""
    built = {"operator": OPERATOR_IMAGE, "trainer": TRAINER_IMAGE, "plain-tf": PLAIN_TF_IMAGE}
    started = time.monotonic()
    run("bash", BUILD_IMAGES, timeout=2400, log="images-build.log")
    FIGURES.record("images built (cached layers reused)", time.monotonic() - started, "s")
    started = time.monotonic()
    load(*built.values(), log="images-load.log")
    FIGURES.record("images loaded into the 2 workers", time.monotonic() - started, "s")
    for image in built.values():
        size = int(run("docker", "image", "inspect", "-f", "{{.Size}}", image).strip())
        FIGURES.record(f"image size {image}", size / 2**20, "MiB")
    return built


def uninstall_others(kubeconfig: Path) -> None:
    """Removes every installed release of the chart (e2e/demo.sh leaves one): two operators would
    both handle the tests' jobs."""
    releases = json.loads(helm(kubeconfig, "list", "--all-namespaces", "--output", "json"))
    for found in releases:
        if str(found["chart"]).startswith(CHART.name + "-"):
            helm(kubeconfig, "uninstall", found["name"], "--namespace", found["namespace"], "--wait")
            kubectl(kubeconfig, "delete", "namespace", found["namespace"], "--wait=false")


def install(kubeconfig: Path, release: str, namespace: str, *extra: str) -> None:
    """The README's install, with the locally built image; the namespace enforces `restricted`."""
    uninstall_others(kubeconfig)
    # A namespace of an earlier install may still be terminating.
    wait_for(
        lambda: kubectl(kubeconfig, "get", "namespace", "--ignore-not-found", namespace, "-o", "name") == "",
        timeout=300,
        message=f"namespace {namespace} of an earlier run gone",
    )
    kubectl(kubeconfig, "create", "namespace", namespace)
    kubectl(
        kubeconfig, "label", "namespace", namespace,
        "pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/warn=restricted",
    )  # fmt: skip
    # As an upgrade does (docs/how-to/upgrade.md): helm installs crds/ once and never upgrades it.
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    helm(
        kubeconfig, "install", release, str(CHART), "--namespace", namespace,
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        # Loaded into the node, not in any registry.
        "--set", "image.pullPolicy=Never",
        "--wait", "--timeout", "3m", *extra,
    )  # fmt: skip


def operator_pod(api: client.ApiClient, namespace: str) -> dict[str, Any]:
    """The active replica's pod: the one the leader Lease's holder (<pod name>_<pid>_<nonce>) names."""
    leases = client.CoordinationV1Api(api).list_namespaced_lease(namespace).items
    holders = {
        lease.spec.holder_identity.split("_")[0]
        for lease in leases
        if lease.spec and lease.spec.holder_identity
    }
    listed = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=OPERATOR_PODS)
    pods = [as_json(api, p) for p in listed.items]
    leading = [p for p in pods if p["status"].get("phase") == "Running" and p["metadata"]["name"] in holders]
    assert len(leading) == 1, [(p["metadata"]["name"], p["status"].get("phase")) for p in pods]
    return leading[0]


@pytest.fixture(scope="package")
def release(kubeconfig: Path, k8s: client.ApiClient, images: dict[str, str]) -> Iterator[str]:
    """The operator, installed once for the training tests; uninstalled at the end."""
    install(kubeconfig, RELEASE, RELEASE_NS)
    wait_for(
        lambda: operator_pod(k8s, RELEASE_NS),
        timeout=120,
        message="the operator pod Running",
    )
    yield RELEASE_NS
    helm(kubeconfig, "uninstall", RELEASE, "--namespace", RELEASE_NS, "--wait", "--ignore-not-found")
    kubectl(kubeconfig, "delete", "namespace", RELEASE_NS, "--wait=false")


@pytest.fixture(scope="package")
def store(kubeconfig: Path, images: dict[str, str]) -> Store:
    """SeaweedFS's S3 gateway in the cluster, with its bucket and identity (objectstore.py)."""
    found, took = install_store(kubeconfig)
    for step, seconds in took.items():
        FIGURES.record(step, seconds, "s")
    return found


@pytest.fixture(scope="package")
def kueue(kubeconfig: Path) -> str:
    """Kueue, installed once (or found installed) and answering; its namespace."""
    for step, seconds in install_kueue(kubeconfig).items():
        FIGURES.record(step, seconds, "s")
    return KUEUE_NAMESPACE


@pytest.fixture
def kueue_objects(kueue: str, k8s: client.ApiClient) -> Iterator[KueueObjects]:
    objects = KueueObjects(k8s)
    yield objects
    objects.delete_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    """A failed test with the in-cluster operator shows its replicas' logs (leadership may have
    moved) and the test namespace's events: CI keeps nothing else of a run."""
    report = yield
    funcargs = getattr(item, "funcargs", {})
    if report.failed and report.when == "call" and "release" in funcargs:
        kubeconfig = funcargs["kubeconfig"]
        readers: dict[str, Callable[[], str]] = {
            "operator log (each replica's, leading or not)": lambda: kubectl(
                kubeconfig, "logs", "-n", RELEASE_NS, "-l", OPERATOR_PODS, "--prefix", "--tail=3000"
            ),
            "events": lambda: kubectl(
                kubeconfig, "get", "events", "-n", str(funcargs.get("namespace")), "--sort-by=.lastTimestamp"
            ),
        }
        for title, read in readers.items():
            try:
                text = read()
            except Exception as error:  # the report must not fail: it says why the text is missing
                text = f"(not read: {error})"
            report.sections.append((title, text[-40000:]))
    return report

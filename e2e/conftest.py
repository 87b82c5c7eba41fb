"""Fixtures for tests against a real control plane: the local KWOK cluster or any cluster given by
KUBECONFIG (e.g. kind).

  kubeconfig  (session)  path of a reachable cluster's kubeconfig; starts e2e/cluster once if needed
  k8s         (session)  kubernetes.client.ApiClient for it
  crd         (session)  the PSTrainingJob CRD applied server-side and Established; its name
  namespace   (function) a fresh namespace, deleted afterwards
  operator_kubeconfig (session) the chart's ServiceAccount and ClusterRole applied; a kubeconfig
                         with that account's token
  operator    (function) `python -m psoperator run` against `namespace` as that account, as an
                         OperatorProcess

Tests using `kubeconfig` are marked `cluster` automatically. Without built binaries the tests are
skipped locally and fail in CI (env CI set).

Only fixtures and hooks are here. The helpers behind them, which tests and the bench import too, are
in e2e/clusters.py (the cluster, the CRD), e2e/accounts.py (ServiceAccount kubeconfigs),
e2e/kubectl.py and e2e/operator_process.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from e2e.accounts import chart_account_kubeconfig
from e2e.clusters import (
    CONTROL_PLANE_BINARIES,
    UP_TIMEOUT,
    apply_crd,
    cluster_sh,
    is_simulated,
    namespace_name,
    reachable,
)
from e2e.operator_process import OperatorProcess
from e2e.paths import CACHE
from e2e.util import unavailable, wait_for


@pytest.fixture(scope="session")
def kubeconfig() -> Iterator[Path]:
    given = os.environ.get("KUBECONFIG")
    if given and reachable(given):
        yield Path(given)
        return
    missing = [b for b in CONTROL_PLANE_BINARIES if not (CACHE / "bin" / b).exists()]
    if missing:
        unavailable(
            f"e2e cluster unavailable: KUBECONFIG={given or '(unset)'} is not reachable and "
            f"{', '.join(missing)} not built in {CACHE / 'bin'}; run e2e/cluster/cluster.sh build (tens of "
            "minutes the first time)"
        )
    path = cluster_sh("kubeconfig", timeout=30).stdout.strip()
    already_up = bool(path) and reachable(path)
    # Also when it runs: `up` is idempotent and recreates a cluster made from an older configuration.
    result = cluster_sh("up", timeout=UP_TIMEOUT)
    if result.returncode != 0:
        pytest.fail(
            f"e2e/cluster/cluster.sh up failed ({result.returncode}):\n{result.stderr[-4000:]}",
            pytrace=False,
        )
    path = result.stdout.strip().splitlines()[-1]
    yield Path(path)
    if not already_up and not os.environ.get("PSOPERATOR_KEEP_CLUSTER"):
        cluster_sh("down", timeout=120)


@pytest.fixture(scope="session")
def k8s(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    yield api
    api.close()


@pytest.fixture(scope="session")
def simulated(k8s: client.ApiClient) -> bool:
    return is_simulated(k8s)


@pytest.fixture
def kwok_only(simulated: bool) -> None:
    """For tests that inject state only simulated nodes accept (a kubelet would overwrite it)."""
    if not simulated:
        pytest.skip("needs KWOK's simulated nodes: a real kubelet overwrites injected pod/node status")


@pytest.fixture(scope="session")
def crd(kubeconfig: Path, k8s: client.ApiClient) -> str:
    return apply_crd(kubeconfig, k8s)


@pytest.fixture
def namespace(k8s: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    core = client.CoreV1Api(k8s)
    name = namespace_name(request.node.name)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"psoperator.io/e2e": "true"}))
    )
    # Pods can only be created once the service account controller has made "default".
    wait_for(
        lambda: core.read_namespaced_service_account("default", name),
        timeout=30,
        message=f"service account default in {name}",
    )
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture(scope="session")
def operator_kubeconfig(
    kubeconfig: Path, k8s: client.ApiClient, crd: str, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A kubeconfig for the chart's own ServiceAccount, bound to the chart's own ClusterRole: the
    operator of every e2e test runs with exactly the RBAC a `helm install` grants, so a verb the
    chart lacks (or no longer needs) shows up as a failing test."""
    path = tmp_path_factory.mktemp("operator") / "kubeconfig"
    return chart_account_kubeconfig(kubeconfig, k8s, "psoperator", path)


@pytest.fixture
def operator(
    crd: str, namespace: str, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator as the chart's ServiceAccount (see `operator_kubeconfig`)."""
    handle = OperatorProcess(operator_kubeconfig, namespace, tmp_path / "operator.log")
    handle.start()
    yield handle
    handle.stop()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-jobs", type=int, default=24, help="jobs of e2e/test_chaos_run.py (the long run: 100)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "kubeconfig" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Any:
    report = yield
    if report.failed and report.when in ("call", "teardown"):
        handle = getattr(item, "funcargs", {}).get("operator")
        if isinstance(handle, OperatorProcess):
            report.sections.append(("operator log", handle.log_text()[-20000:] or "(empty)"))
    return report

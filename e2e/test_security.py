"""The operator's own security: the chart's namespace-scoped mode runs jobs with Roles only, and the
operator's log holds neither environment values nor pod specs."""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e import chaos, psjobs
from e2e.accounts import chart_account_kubeconfig
from e2e.kubectl import _kubectl, kubectl
from e2e.operator_process import OperatorProcess, chief_key
from e2e.util import as_json, wait_for
from psoperator.api.names import chief_token_secret_name
from psoperator.kube import Kube
from psoperator.render import render_children

Obj = dict[str, Any]
SCOPED_RELEASE = "psop-scoped"


@pytest.fixture
def scoped_operator(
    kubeconfig: Path, k8s: client.ApiClient, crd: str, namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The operator as the chart's account with `watchNamespaces` = [namespace]: a Role there, and a
    ClusterRole with the cluster-scoped reads only."""
    path = chart_account_kubeconfig(
        kubeconfig, k8s, SCOPED_RELEASE, tmp_path / "kubeconfig", f"watchNamespaces={{{namespace}}}"
    )
    handle = OperatorProcess(path, namespace, tmp_path / "operator.log")
    handle.start()
    yield handle
    handle.stop()
    selector = f"app.kubernetes.io/instance={SCOPED_RELEASE}"
    kubectl(kubeconfig, "delete", "clusterrole,clusterrolebinding", "-l", selector, "--ignore-not-found")


def _can(kubeconfig: Path, verb: str, resource: str, namespace: str) -> bool:
    result = subprocess.run(
        [_kubectl(), "--kubeconfig", str(kubeconfig), "auth", "can-i", verb, resource, "-n", namespace],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return result.stdout.strip() == "yes"


def test_the_namespace_scoped_chart_runs_a_job_and_reaches_no_other_namespace(
    k8s: client.ApiClient, namespace: str, scoped_operator: OperatorProcess
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    account = scoped_operator.kubeconfig
    assert _can(account, "delete", "pods", namespace)
    assert not _can(account, "list", "pods", "default")
    assert not _can(account, "list", "pstrainingjobs.psoperator.io", "default")
    for verb in ("get", "list", "watch"):  # the chiefs' tokens are created, never read
        assert not _can(account, verb, "secrets", namespace)
    assert _can(account, "create", "secrets", namespace)


def test_the_operator_logs_no_environment_value_and_no_pod_spec(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """At --verbose, through a job's start and a coordinated restart."""
    operator.stop()
    operator.extra_args += ["--verbose"]
    operator.start()
    canary = f"psop-canary-{uuid.uuid4().hex}"
    container = {"name": "trainer", "env": [{"name": "API_KEY", "value": canary}]}
    template = {"template": {"spec": {"containers": [container]}}}
    psjobs.create(
        k8s, namespace, psjobs.manifest("ctr", chief=template, ps={"template": template["template"]})
    )
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    wait_for(lambda: psjobs.status(k8s, namespace, "ctr")["tracking"]["psEstablished"], timeout=30)
    chaos.fail_container(
        k8s, namespace, psjobs.running_pod(k8s, namespace, "ctr", "ps", 0)["metadata"]["name"], 1
    )
    wait_for(
        lambda: psjobs.status(k8s, namespace, "ctr").get("restarts") == 1, timeout=30, message="a restart"
    )
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=60)
    log = operator.log_text()
    assert "Handler 'job-changed' succeeded" in log  # the log is there
    assert canary not in log
    assert "terminationMessagePath" not in log and "TF_CONFIG" not in log
    # The chief's token: in its Secret, made with the chief's Job, and in no line of the log.
    job = psjobs.get(k8s, namespace, "ctr")
    assert job is not None
    token = chief_key().token(job["metadata"]["uid"])
    name = chief_token_secret_name("ctr", job["metadata"]["uid"])
    secret = as_json(k8s, client.CoreV1Api(k8s).read_namespaced_secret(name, namespace))
    assert base64.b64decode(secret["data"]["token"]).decode() == token
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"] and secret["immutable"]
    assert token not in log and f"Secret/{name}" in log


def _peer_policy(job: Obj) -> Obj:
    return next(m for m in render_children(job) if m["metadata"]["name"] == "ctr-peers")


def test_a_patch_planned_from_a_stale_view_never_touches_a_strangers_object_nor_makes_one(
    k8s: client.ApiClient, namespace: str
) -> None:
    """The operator's view (its watch) still shows the job's NetworkPolicy after it was deleted: a
    patch planned from it carries that child's uid, so a stranger's object made since under the name
    is left as it is (a name conflict), and no object is made where there is none."""
    job = psjobs.create(k8s, namespace, psjobs.manifest("ctr"))  # no operator runs: nothing else acts
    owner, kube = job["metadata"]["uid"], Kube(k8s)

    def policy(port: int) -> Obj:
        return _peer_policy({**psjobs.manifest("ctr", port=port), "metadata": job["metadata"]})

    [created] = kube.apply_children(namespace, owner, [policy(2222)], []).written
    [ours] = kube.apply_children(namespace, owner, [policy(2223)], [created]).written  # folded, applied
    api = client.NetworkingV1Api(k8s)
    api.delete_namespaced_network_policy("ctr-peers", namespace)
    wanted = policy(2224)
    with pytest.raises(ApiException) as none_there:
        kube.apply_children(namespace, owner, [wanted], [ours])
    assert none_there.value.status == 409
    assert api.list_namespaced_network_policy(namespace).items == []

    stranger: Obj = {
        "metadata": {"name": "ctr-peers"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }
    api.create_namespaced_network_policy(namespace, stranger)  # type: ignore[arg-type]
    result = kube.apply_children(namespace, owner, [wanted], [ours])
    assert result.conflicts == ["NetworkPolicy/ctr-peers"] and result.patched == []
    after = as_json(k8s, api.read_namespaced_network_policy("ctr-peers", namespace))
    assert after["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    assert "ownerReferences" not in after["metadata"]
    assert {m["manager"] for m in after["metadata"]["managedFields"]} == {"OpenAPI-Generator"}

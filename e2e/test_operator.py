"""The operator core against the real control plane: children, TF_CONFIG, status columns, level-based
reconciling, garbage collection, and leaving alone what it does not own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e import psjobs
from e2e.kubectl import _kubectl
from e2e.operator_process import OperatorProcess
from e2e.util import as_json, condition, wait_for
from psoperator import contract
from psoperator.api.models import MAX_REPLICAS, MAX_WORKERS


def _children(api: client.ApiClient, namespace: str, name: str) -> set[tuple[str, str]]:
    selector = f"{psjobs.LABEL_JOB}={name}"
    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    listed = [
        ("Service", core.list_namespaced_service(namespace, label_selector=selector)),
        ("StatefulSet", apps.list_namespaced_stateful_set(namespace, label_selector=selector)),
        ("Job", batch.list_namespaced_job(namespace, label_selector=selector)),
    ]
    return {
        (kind, item["metadata"]["name"]) for kind, result in listed for item in as_json(api, result)["items"]
    }


def _running_with_every_task_ready(api: client.ApiClient, namespace: str, name: str) -> psjobs.Obj | None:
    status = psjobs.status(api, namespace, name)
    columns = (status.get("phase"), status.get("psReady"), status.get("workersReady"))
    return status if columns == ("Running", "2/2", "2/2") else None


EXPECTED = {
    ("Service", "ctr-chief"), ("Service", "ctr-ps"), ("Service", "ctr-worker"),
    ("StatefulSet", "ctr-ps"), ("StatefulSet", "ctr-worker"), ("Job", "ctr-chief"),
}  # fmt: skip


def test_a_job_runs_with_its_children_and_tf_config(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess, kubeconfig: Path
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    wait_for(
        lambda: _children(k8s, namespace, "ctr") == EXPECTED,
        timeout=30,
        message=lambda: f"children, got {_children(k8s, namespace, 'ctr')}",
    )
    # Running needs only the chief and the PS: wait for the workers too, which this test asserts.
    status = wait_for(
        lambda: _running_with_every_task_ready(k8s, namespace, "ctr"),
        timeout=90,
        message=lambda: f"Running with 2/2 PS and workers; status is {psjobs.status(k8s, namespace, 'ctr')}",
    )
    assert condition(status, "Created")["status"] == "True"  # type: ignore[index]
    assert status["observedGeneration"] == 1

    # Workers asked for a GPU and tolerate the GPU taint: they land on GPU nodes. PS do not.
    core = client.CoreV1Api(k8s)
    for role, pool in (("worker", "gpu"), ("ps", "cpu")):
        for pod in psjobs.pods(k8s, namespace, "ctr", role):
            node = as_json(k8s, core.read_node(pod["spec"]["nodeName"]))
            assert node["metadata"]["labels"].get("psoperator.io/pool") == pool, (
                role,
                pod["spec"]["nodeName"],
            )

    # The kubelet would expand $(PSOP_TASK_INDEX) from the pod-index label the StatefulSet controller set.
    ps1 = psjobs.running_pod(k8s, namespace, "ctr", "ps", 1)
    assert ps1["metadata"]["labels"]["apps.kubernetes.io/pod-index"] == "1"
    env = {e["name"]: e for e in ps1["spec"]["containers"][0]["env"]}
    assert (
        env["PSOP_TASK_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    tf_config = json.loads(env["TF_CONFIG"]["value"].replace("$(PSOP_TASK_INDEX)", "1"))
    assert tf_config["task"] == {"type": "ps", "index": 1}
    assert tf_config["cluster"]["worker"] == [
        f"ctr-worker-{i}.ctr-worker.{namespace}.svc.cluster.local:2222" for i in range(2)
    ]
    assert ps1["spec"]["hostname"] == "ctr-ps-1" and ps1["spec"]["subdomain"] == "ctr-ps"
    chief = psjobs.running_pod(k8s, namespace, "ctr", "chief")
    assert chief["spec"]["hostname"] == "ctr-chief-0" and chief["spec"]["subdomain"] == "ctr-chief"

    # kubectl get psjob tells the story in its columns.
    out = subprocess.run(
        [_kubectl(), "--kubeconfig", str(kubeconfig), "get", "psjob", "ctr", "-n", namespace],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    header, row = out.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "PHASE", "PS", "WORKERS", "RESTARTS"]
    assert row.split()[:5] == ["ctr", "Running", "2/2", "2/2", "0"]

    events = client.CoreV1Api(k8s).list_namespaced_event(namespace, field_selector="involvedObject.name=ctr")
    assert "Running" in {e.reason for e in events.items}


def test_a_child_deleted_by_hand_comes_back(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    wait_for(lambda: _children(k8s, namespace, "ctr") == EXPECTED, timeout=30, message="children")
    apps = client.AppsV1Api(k8s)
    old_uid = as_json(k8s, apps.read_namespaced_stateful_set("ctr-ps", namespace))["metadata"]["uid"]
    apps.delete_namespaced_stateful_set("ctr-ps", namespace)
    client.CoreV1Api(k8s).delete_namespaced_service("ctr-worker", namespace)
    wait_for(
        lambda: (
            as_json(k8s, apps.read_namespaced_stateful_set("ctr-ps", namespace))["metadata"]["uid"] != old_uid
            and _children(k8s, namespace, "ctr") == EXPECTED
        ),
        timeout=30,
        message="the StatefulSet and Service recreated",
    )
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)


def test_deleting_the_job_deletes_every_child(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, namespace, psjobs.PLURAL, "ctr"
    )
    wait_for(lambda: psjobs.get(k8s, namespace, "ctr") is None, timeout=30, message="the job gone")
    wait_for(
        lambda: not _children(k8s, namespace, "ctr") and not psjobs.pods(k8s, namespace, "ctr", "ps"),
        timeout=60,
        message=lambda: f"children garbage-collected, left {_children(k8s, namespace, 'ctr')}",
    )


def test_an_object_it_does_not_own_is_left_alone(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    core = client.CoreV1Api(k8s)
    foreign = client.V1Service(
        metadata=client.V1ObjectMeta(name="ctr-ps", labels={"team": "someone-else"}),
        spec=client.V1ServiceSpec(selector={"app": "theirs"}, ports=[client.V1ServicePort(port=80)]),
    )
    core.create_namespaced_service(namespace, foreign)
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))

    def conflict_reported() -> bool:
        events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=ctr").items
        return any(e.reason == "NameConflict" and "Service/ctr-ps" in (e.message or "") for e in events)

    wait_for(conflict_reported, timeout=30, message="a NameConflict event")
    theirs = as_json(k8s, core.read_namespaced_service("ctr-ps", namespace))
    assert theirs["spec"]["selector"] == {"app": "theirs"}
    assert "ownerReferences" not in theirs["metadata"]
    # The rest of the job is created as usual.
    wait_for(lambda: ("StatefulSet", "ctr-ps") in _children(k8s, namespace, "ctr"), timeout=30, message="sts")


def test_invalid_odd_objects_do_not_crash_the_operator(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """A pod that claims to belong to a job but is not its child is ignored, and the operator lives on."""
    core = client.CoreV1Api(k8s)
    odd = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="impostor", labels={psjobs.LABEL_JOB: "ctr", psjobs.LABEL_ROLE: "ps"}
        ),
        spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="x")]),
    )
    core.create_namespaced_pod(namespace, odd)
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    assert operator.running
    try:
        core.read_namespaced_pod("impostor", namespace)
    except ApiException as error:  # pragma: no cover - the assertion message is the point
        raise AssertionError(f"the operator deleted a pod it does not own: {error}") from error


def _cluster_of_config_map(api: client.ApiClient, namespace: str, job: str) -> dict[str, list[str]]:
    """The cluster a task composes from the job's TF_CONFIG ConfigMap, as the runtime does."""
    config_map = as_json(api, client.CoreV1Api(api).read_namespaced_config_map(f"{job}-tf-config", namespace))
    assert config_map["metadata"]["ownerReferences"][0]["kind"] == "PSTrainingJob"
    text = config_map["data"]["cluster.json"]
    return dict(json.loads(contract.tf_config_from_file(text, {contract.ENV_ROLE: "ps"}))["cluster"])


def test_a_cluster_too_large_for_the_environment_reaches_its_pods_through_a_config_map(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """400 workers: past the environment's 32 KiB for this namespace's addresses. Most workers stay
    Pending (8 GPUs in this cluster): the job runs once its chief and PS do."""
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", worker={"replicas": 400}))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    core = client.CoreV1Api(k8s)

    def cluster() -> dict[str, list[str]]:
        return _cluster_of_config_map(k8s, namespace, "ctr")

    assert [len(cluster()[role]) for role in ("chief", "ps", "worker")] == [1, 2, 400]
    chief = psjobs.running_pod(k8s, namespace, "ctr", "chief")
    [container] = chief["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "TF_CONFIG" not in env and env["PSOP_TF_CONFIG_FILE"] == "/etc/psoperator/tf-config/cluster.json"
    assert {"name": "psoperator-tf-config", "configMap": {"name": "ctr-tf-config", "defaultMode": 420}} in (
        chief["spec"]["volumes"]
    )
    # A child like the others: deleted by hand, it comes back.
    core.delete_namespaced_config_map("ctr-tf-config", namespace)
    wait_for(lambda: len(cluster()["worker"]) == 400, timeout=30, message="the ConfigMap recreated")


def test_the_largest_job_the_crd_admits_gets_every_child_from_the_api_server(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """1,000 PS and 10,000 workers, in this test's namespace (51 characters: its addresses alone
    would be 1.2 MB, past a ConfigMap's 1 MiB). A quota of 3 pods keeps the cluster from running
    11,001 of them: what is tested is that the API server takes every child as rendered."""
    core = client.CoreV1Api(k8s)
    quota = client.V1ResourceQuota(metadata=client.V1ObjectMeta(name="pods"), spec={"hard": {"pods": "3"}})
    core.create_namespaced_resource_quota(namespace, quota)
    workers = {"replicas": MAX_WORKERS, "template": {"spec": {"containers": [{"name": "trainer"}]}}}
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", ps={"replicas": MAX_REPLICAS}, worker=workers))

    def replicas() -> dict[str, int]:
        listed = client.AppsV1Api(k8s).list_namespaced_stateful_set(
            namespace, label_selector=psjobs.LABEL_JOB
        )
        return {s["metadata"]["name"]: s["spec"]["replicas"] for s in as_json(k8s, listed)["items"]}

    wait_for(lambda: len(replicas()) == 2, timeout=60, message="the StatefulSets")
    assert replicas() == {"ctr-ps": MAX_REPLICAS, "ctr-worker": MAX_WORKERS}
    cluster = _cluster_of_config_map(k8s, namespace, "ctr")
    assert [len(cluster[role]) for role in ("chief", "ps", "worker")] == [1, MAX_REPLICAS, MAX_WORKERS]
    assert (
        cluster["worker"][-1] == f"ctr-worker-{MAX_WORKERS - 1}.ctr-worker.{namespace}.svc.cluster.local:2222"
    )
    wait_for(lambda: _children(k8s, namespace, "ctr") >= EXPECTED, timeout=60, message="every child")
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.kind=PSTrainingJob").items
    assert not [e.message for e in events if e.reason == "ChildRejected"]

"""The e2e cluster itself: simulated CPU and GPU nodes, scheduling, pod IPs and every chaos helper."""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.request import urlopen

import pytest
from kubernetes import client, watch

from e2e import chaos
from e2e.util import as_json, condition, get_node, get_pod, holds_for, wait_for

pytestmark = pytest.mark.cluster

Json = dict[str, Any]
GPU = "nvidia.com/gpu"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
OUT_OF_SERVICE_TAINT = "node.kubernetes.io/out-of-service"


def pod_manifest(name: str, gpus: int = 0, tolerate_gpu: bool = False, restart_policy: str = "Never") -> Json:
    container: Json = {
        "name": "main",
        "image": "busybox:1.36",
        "command": ["sleep", "infinity"],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
    }
    if gpus:
        container["resources"]["limits"] = {GPU: str(gpus)}
    spec: Json = {
        "containers": [container],
        "restartPolicy": restart_policy,
        "terminationGracePeriodSeconds": 5,
    }
    if tolerate_gpu:
        spec["tolerations"] = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "e2e-cluster"}},
        "spec": spec,
    }


def create_pod(api: client.ApiClient, namespace: str, manifest: Json) -> str:
    pod = client.V1Pod.from_dict(manifest)
    assert pod is not None
    client.CoreV1Api(api).create_namespaced_pod(namespace, pod)
    return str(manifest["metadata"]["name"])


def phase(pod: Json) -> str | None:
    value = pod.get("status", {}).get("phase")
    return str(value) if value else None


def summary(api: client.ApiClient, namespace: str, name: str) -> str:
    pod = get_pod(api, namespace, name)
    return json.dumps({"node": pod["spec"].get("nodeName"), **pod.get("status", {})})[:1500]


def wait_pod_phase(api: client.ApiClient, namespace: str, name: str, want: str, timeout: float = 60) -> Json:
    def reached() -> Json | None:
        pod = get_pod(api, namespace, name)
        return pod if phase(pod) == want else None

    return wait_for(
        reached, timeout=timeout, message=lambda: f"{name} {want}: {summary(api, namespace, name)}"
    )


def wait_running(api: client.ApiClient, namespace: str, name: str, timeout: float = 60) -> Json:
    pod = wait_pod_phase(api, namespace, name, "Running", timeout)
    assert pod["status"].get("podIP"), pod["status"]
    return pod


def nodes(api: client.ApiClient, selector: str) -> list[Json]:
    return [as_json(api, n) for n in client.CoreV1Api(api).list_node(label_selector=selector).items]


def gpu_node_names(api: client.ApiClient) -> set[str]:
    return {n["metadata"]["name"] for n in nodes(api, "nvidia.com/gpu.present=true")}


def only_container(pod: Json) -> Json:
    statuses: list[Json] = pod["status"]["containerStatuses"]
    assert len(statuses) == 1, statuses
    return statuses[0]


def ready_status(obj: Json) -> str | None:
    cond = condition(obj.get("status"), "Ready")
    return str(cond["status"]) if cond else None


class PodHistory:
    """Every version of one pod seen by a watch, from before an action until the pod is deleted."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str):
        core = client.CoreV1Api(api)
        listed = core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}")
        self.versions: list[Json] = [as_json(api, p) for p in listed.items]
        self.deleted = threading.Event()
        self.error: Exception | None = None
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        since = listed.metadata.resource_version if listed.metadata else None
        self._thread = threading.Thread(target=self._run, args=(core, namespace, name, since), daemon=True)
        self._thread.start()

    def _run(self, core: client.CoreV1Api, namespace: str, name: str, since: str | None) -> None:
        try:
            for event in self._watch.stream(  # type: ignore[no-untyped-call]
                core.list_namespaced_pod,
                namespace,
                field_selector=f"metadata.name={name}",
                resource_version=since,
                timeout_seconds=120,
            ):
                self.versions.append(event["raw_object"])
                if event["type"] == "DELETED":
                    self.deleted.set()
                    return
        except Exception as exc:  # e.g. the cluster went down; the waits report what was seen
            self.error = exc

    def wait_deleted(self, timeout: float = 60) -> None:
        wait_for(
            self.deleted.is_set,
            timeout=timeout,
            message=lambda: f"deletion; phases seen {self.phases()}, watch error {self.error}",
        )
        self.close()

    def close(self) -> None:
        self._watch.stop()  # type: ignore[no-untyped-call]

    def phases(self) -> list[str | None]:
        return [phase(v) for v in self.versions]

    def disruption(self) -> Json | None:
        for version in self.versions:
            cond = condition(version.get("status"), "DisruptionTarget")
            if cond and cond["status"] == "True":
                return cond
        return None


@pytest.fixture
def running_pod(k8s: client.ApiClient, namespace: str) -> Iterator[str]:
    name = create_pod(k8s, namespace, pod_manifest("victim"))
    wait_running(k8s, namespace, name)
    yield name


def test_cluster_has_simulated_cpu_and_gpu_nodes(k8s: client.ApiClient) -> None:
    cpu = nodes(k8s, "psoperator.io/pool=cpu")
    gpu = nodes(k8s, "nvidia.com/gpu.present=true")
    assert len(cpu) >= 2 and len(gpu) >= 2, [n["metadata"]["name"] for n in cpu + gpu]
    for node in cpu + gpu:
        assert ready_status(node) == "True", node["metadata"]["name"]
        allocatable = node["status"]["allocatable"]
        assert int(allocatable["pods"]) >= 32 and allocatable["cpu"] and allocatable["memory"]
    for node in cpu:
        assert GPU not in node["status"]["capacity"]
    for node in gpu:
        assert node["status"]["capacity"][GPU] == "4"
        assert node["status"]["allocatable"][GPU] == "4"
        taints = node["spec"].get("taints", [])
        assert {"key": GPU, "value": "present", "effect": "NoSchedule"} in taints


def test_gpu_pod_with_toleration_runs_on_a_gpu_node(k8s: client.ApiClient, namespace: str) -> None:
    name = create_pod(k8s, namespace, pod_manifest("gpu-worker", gpus=1, tolerate_gpu=True))
    pod = wait_running(k8s, namespace, name)
    assert pod["spec"]["nodeName"] in gpu_node_names(k8s)
    assert ready_status(pod) == "True"
    assert "running" in only_container(pod)["state"]


def test_pods_without_gpu_toleration_stay_off_gpu_nodes(k8s: client.ApiClient, namespace: str) -> None:
    plain = [create_pod(k8s, namespace, pod_manifest(f"plain-{i}")) for i in range(4)]
    for name in plain:
        pod = wait_running(k8s, namespace, name)
        assert pod["spec"]["nodeName"] not in gpu_node_names(k8s)

    greedy = create_pod(k8s, namespace, pod_manifest("gpu-no-toleration", gpus=1))

    def unschedulable() -> Json | None:
        cond = condition(get_pod(k8s, namespace, greedy).get("status"), "PodScheduled")
        return cond if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable" else None

    cond = wait_for(unschedulable, timeout=30, message="PodScheduled=False/Unschedulable")
    # "0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint(s)."
    assert "untolerated taint" in cond["message"] and f"Insufficient {GPU}" in cond["message"], cond
    assert "nodeName" not in get_pod(k8s, namespace, greedy)["spec"]


def test_pod_ips_are_on_loopback_and_servable(k8s: client.ApiClient, namespace: str, kwok_only: None) -> None:
    """Pod IPs come from the nodes' loopback pod CIDRs, so a test can play a pod's HTTP server."""
    pod = wait_running(k8s, namespace, create_pod(k8s, namespace, pod_manifest("chief")))
    ip = ipaddress.ip_address(pod["status"]["podIP"])
    assert ip.is_loopback, ip
    node = get_node(k8s, pod["spec"]["nodeName"])
    assert ip in ipaddress.ip_network(node["spec"]["podCIDR"])
    assert pod["status"]["hostIP"] in [a["address"] for a in node["status"]["addresses"]]

    class Progress(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer((str(ip), 0), Progress)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with urlopen(f"http://{ip}:{server.server_address[1]}/progress", timeout=5) as response:
            assert json.load(response) == {"path": "/progress"}
    finally:
        server.shutdown()
        server.server_close()


def test_fail_container_sets_exit_code_and_the_pod_stays_failed(
    k8s: client.ApiClient, namespace: str, running_pod: str, kwok_only: None
) -> None:
    pod = chaos.fail_container(k8s, namespace, running_pod, exit_code=3, message="step 7: loss is NaN")
    terminated = only_container(pod)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (
        3,
        "Error",
        "step 7: loss is NaN",
    )
    assert ready_status(pod) == "False"
    holds_for(
        lambda: phase(get_pod(k8s, namespace, running_pod)) == "Failed",
        duration=3,
        message=lambda: summary(k8s, namespace, running_pod),
    )
    assert only_container(get_pod(k8s, namespace, running_pod))["state"]["terminated"]["exitCode"] == 3


def test_oom_kill_reports_137_oomkilled(
    k8s: client.ApiClient, namespace: str, running_pod: str, kwok_only: None
) -> None:
    pod = chaos.oom_kill(k8s, namespace, running_pod)
    assert phase(pod) == "Failed"
    terminated = only_container(pod)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, "OOMKilled")


def test_complete_pod_succeeds_with_exit_code_0(
    k8s: client.ApiClient, namespace: str, running_pod: str, kwok_only: None
) -> None:
    pod = chaos.complete_pod(k8s, namespace, running_pod)
    assert phase(pod) == "Succeeded"
    terminated = only_container(pod)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")


def test_pod_annotated_before_it_runs_fails_as_soon_as_it_runs(
    k8s: client.ApiClient, namespace: str, kwok_only: None
) -> None:
    manifest = pod_manifest("crash-on-start")
    manifest["metadata"]["annotations"] = {chaos.ANNOTATION_EXIT_CODE: "2"}
    pod = wait_pod_phase(k8s, namespace, create_pod(k8s, namespace, manifest), "Failed", timeout=30)
    assert only_container(pod)["state"]["terminated"]["exitCode"] == 2


def test_restart_container_in_place(k8s: client.ApiClient, namespace: str, kwok_only: None) -> None:
    name = create_pod(k8s, namespace, pod_manifest("restarts", restart_policy="Always"))
    wait_running(k8s, namespace, name)
    pod = chaos.restart_container(k8s, namespace, name, exit_code=137, reason="OOMKilled")
    status = only_container(pod)
    assert status["restartCount"] == 1
    last = status["lastState"]["terminated"]
    assert (last["exitCode"], last["reason"]) == (137, "OOMKilled")
    assert "running" in status["state"] and status["ready"]

    assert only_container(chaos.restart_container(k8s, namespace, name))["restartCount"] == 2

    def still_running_twice_restarted() -> bool:
        pod = get_pod(k8s, namespace, name)
        return phase(pod) == "Running" and only_container(pod)["restartCount"] == 2

    holds_for(still_running_twice_restarted, duration=2, message=lambda: summary(k8s, namespace, name))


def test_node_not_ready_and_back(
    k8s: client.ApiClient, namespace: str, running_pod: str, kwok_only: None
) -> None:
    node = get_pod(k8s, namespace, running_pod)["spec"]["nodeName"]

    def tainted_not_ready() -> bool:
        return any(t["key"] == NOT_READY_TAINT for t in get_node(k8s, node)["spec"].get("taints", []))

    try:
        chaos.make_node_not_ready(k8s, node)
        cond = condition(get_node(k8s, node).get("status"), "Ready")
        assert cond is not None and (cond["status"], cond["reason"]) == ("False", "KubeletNotReady")
        # The node lifecycle controller believes it too: it taints the node.
        wait_for(tainted_not_ready, timeout=60, message=f"{NOT_READY_TAINT} taint on {node}")
        holds_for(
            lambda: ready_status(get_node(k8s, node)) == "False", duration=2, message=f"{node} NotReady"
        )
    finally:
        chaos.make_node_ready(k8s, node)
        wait_for(lambda: not tainted_not_ready(), timeout=30, message=f"{NOT_READY_TAINT} taint removed")
    assert ready_status(get_node(k8s, node)) == "True"


def test_node_unreachable_fenced_and_back(
    k8s: client.ApiClient, namespace: str, running_pod: str, kwok_only: None
) -> None:
    """Ready=Unknown as the node lifecycle controller posts it (which then taints the node
    unreachable), the out-of-service taint set beside that one and removed, and the node back."""
    node = get_pod(k8s, namespace, running_pod)["spec"]["nodeName"]

    def taints() -> set[str]:
        return {t["key"] for t in get_node(k8s, node)["spec"].get("taints", [])}

    try:
        chaos.make_node_unreachable(k8s, node)
        cond = condition(get_node(k8s, node).get("status"), "Ready")
        assert cond is not None and (cond["status"], cond["reason"]) == ("Unknown", "NodeStatusUnknown")
        wait_for(lambda: UNREACHABLE_TAINT in taints(), timeout=60, message=f"{UNREACHABLE_TAINT} on {node}")
        chaos.fence_node(k8s, node)
        assert {UNREACHABLE_TAINT, OUT_OF_SERVICE_TAINT} <= taints()
        chaos.unfence_node(k8s, node)
        assert OUT_OF_SERVICE_TAINT not in taints()
    finally:
        chaos.unfence_node(k8s, node)
        chaos.make_node_ready(k8s, node)
    wait_for(lambda: UNREACHABLE_TAINT not in taints(), timeout=30, message=f"{UNREACHABLE_TAINT} removed")
    assert ready_status(get_node(k8s, node)) == "True"


def test_evict_pod_sets_disruption_target_then_fails_and_deletes_it(
    k8s: client.ApiClient, namespace: str, running_pod: str
) -> None:
    history = PodHistory(k8s, namespace, running_pod)
    chaos.evict_pod(k8s, namespace, running_pod)
    history.wait_deleted()
    disruption = history.disruption()
    assert disruption is not None and disruption["reason"] == "EvictionByEvictionAPI", history.versions
    assert "Failed" in history.phases()


def test_an_evicted_pod_with_a_drain_time_keeps_running_that_long_then_is_removed(
    k8s: client.ApiClient, namespace: str, running_pod: str, kwok_only: None
) -> None:
    history = PodHistory(k8s, namespace, running_pod)
    chaos.evict_pod(k8s, namespace, running_pod, drain_seconds=4)

    def draining() -> bool:
        pod = get_pod(k8s, namespace, running_pod)
        return bool(pod["metadata"].get("deletionTimestamp")) and pod["status"]["phase"] == "Running"

    holds_for(draining, duration=2.5, message=f"{running_pod} running while it drains")
    history.wait_deleted(timeout=30)
    assert "Failed" in history.phases()


def test_preempt_pod_sets_disruption_target_then_fails_and_deletes_it(
    k8s: client.ApiClient, namespace: str, running_pod: str
) -> None:
    history = PodHistory(k8s, namespace, running_pod)
    chaos.preempt_pod(k8s, namespace, running_pod)
    history.wait_deleted()
    disruption = history.disruption()
    assert disruption is not None and disruption["reason"] == "PreemptionByScheduler", history.versions
    assert "Failed" in history.phases()


def test_scheduler_preempts_a_lower_priority_gpu_pod_like_preempt_pod_does(
    k8s: client.ApiClient, namespace: str
) -> None:
    """Real preemption on the simulated GPU pool writes what chaos.preempt_pod imitates."""
    scheduling = client.SchedulingV1Api(k8s)
    low, high = f"{namespace}-low", f"{namespace}-high"
    for name, value in ((low, 10), (high, 1000)):
        scheduling.create_priority_class(
            client.V1PriorityClass(metadata=client.V1ObjectMeta(name=name), value=value)
        )
    histories: dict[str, PodHistory] = {}
    try:
        fillers = []
        for node in sorted(gpu_node_names(k8s)):
            manifest = pod_manifest(f"low-{node}", gpus=4, tolerate_gpu=True)
            manifest["spec"]["priorityClassName"] = low
            fillers.append(create_pod(k8s, namespace, manifest))
        for name in fillers:
            wait_running(k8s, namespace, name)
        histories.update({name: PodHistory(k8s, namespace, name) for name in fillers})

        manifest = pod_manifest("high", gpus=4, tolerate_gpu=True)
        manifest["spec"]["priorityClassName"] = high
        pod = wait_running(k8s, namespace, create_pod(k8s, namespace, manifest))
        assert pod["spec"]["nodeName"] in gpu_node_names(k8s)

        # The scheduler binds the preemptor only after its victim is gone; the watches may lag a little.
        victims = wait_for(
            lambda: [h for h in histories.values() if h.disruption()],
            timeout=30,
            message=lambda: f"a preempted filler: { {n: h.phases() for n, h in histories.items()} }",
        )
        assert len(victims) == 1, {n: h.phases() for n, h in histories.items()}
        victims[0].wait_deleted()
        disruption = victims[0].disruption()
        assert disruption is not None and disruption["reason"] == "PreemptionByScheduler", victims[0].versions
    finally:
        for history in histories.values():
            history.close()
        for name in (low, high):
            scheduling.delete_priority_class(name)

"""Queueing with Kueue, for real: Kueue v0.17 built here and installed with its own chart
(e2e/real/kueue.py), the operator of the chart in-cluster, the example trained on the real kubelet.

A ClusterQueue whose quota fits one example job: the second waits, queued, until the first has
succeeded. A higher-priority job preempts a training one, which checkpoints before it stops, is
requeued, and resumes from that checkpoint. Each job has one Workload at a time, and none is left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from kubernetes import client

from e2e import psjobs
from e2e.kubectl import kubectl
from e2e.real import example
from e2e.real.conftest import Figures
from e2e.real.kueue import (
    GROUP,
    VERSION,
    KueueObjects,
    cluster_queue,
    local_queue,
    opt_in,
    resource_flavor,
    workload_priority_class,
)
from e2e.real.test_training import CHECKPOINT_STEPS, STEPS, LastStep, running_chief, wait_succeeded
from e2e.util import condition, wait_for

Obj = dict[str, Any]
QUEUE, CLUSTER_QUEUE, FLAVOR = "team", "psop-e2e-cq", "psop-e2e-linux"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# One example job asks for 600m and 3,840Mi (examples/ctr-job.yaml at this machine's sizes): the
# quota fits one, not two.
QUOTA = ("900m", "5Gi")


def queued_job(namespace: str, name: str, steps: int, priority: str | None = None) -> list[Obj]:
    """The example, renamed (its checkpoint claim too) and labelled for the queue."""
    docs = example.example_manifests(steps)
    for doc in docs:
        if doc["kind"] == "PersistentVolumeClaim":
            doc["metadata"]["name"] = f"{name}-checkpoints"
        if doc["kind"] == "PSTrainingJob":
            doc["metadata"]["name"] = name
            labels = {QUEUE_LABEL: QUEUE}
            if priority is not None:
                labels["kueue.x-k8s.io/priority-class"] = priority
            doc["metadata"]["labels"] = labels
            volume = doc["spec"]["checkpoint"]["volume"]
            volume["persistentVolumeClaim"]["claimName"] = f"{name}-checkpoints"
    return example.with_volumes(namespace, docs)


def apply(kubeconfig: Path, namespace: str, docs: list[Obj]) -> None:
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))


def workloads(api: client.ApiClient, namespace: str) -> list[Obj]:
    custom = client.CustomObjectsApi(api)
    listed = cast(Obj, custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads"))
    return list(listed["items"])


class OneWorkloadEach:
    """Watches, every half second, that no job has two Workloads at once."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.most, self._api, self._namespace = 0, api, namespace
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.5):
            owners = [
                o["uid"]
                for w in workloads(self._api, self._namespace)
                for o in w["metadata"]["ownerReferences"]
            ]
            self.most = max([self.most, *(owners.count(uid) for uid in owners)])

    def stop(self) -> int:
        self._done.set()
        self._thread.join()
        return self.most


@pytest.fixture
def queue(kubeconfig: Path, namespace: str, release: str, kueue_objects: KueueObjects) -> Iterator[str]:
    """A LocalQueue in the test's namespace (opted in to Kueue), on a ClusterQueue whose quota fits
    one example job, in a flavor that puts the pods on Linux nodes."""
    opt_in(kubeconfig, namespace)
    flavor = resource_flavor(FLAVOR)
    flavor["spec"] = {"nodeLabels": {"kubernetes.io/os": "linux"}}
    kueue_objects.create(flavor)
    kueue_objects.create(cluster_queue(CLUSTER_QUEUE, FLAVOR, *QUOTA))
    kueue_objects.create(local_queue(namespace, QUEUE, CLUSTER_QUEUE))
    yield QUEUE


def queued_condition(api: client.ApiClient, namespace: str, name: str) -> Obj | None:
    return condition(psjobs.status(api, namespace, name), "Queued")


def test_two_jobs_for_a_quota_of_one_run_one_after_the_other(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, queue: str, figures: Figures
) -> None:
    watch = OneWorkloadEach(k8s, namespace)
    created = time.monotonic()
    apply(kubeconfig, namespace, queued_job(namespace, "first", STEPS // 2))
    admitted = wait_for(
        lambda: (c := queued_condition(k8s, namespace, "first")) and c["reason"] == "Admitted" and c,
        timeout=120,
        message="the first job admitted",
    )
    figures.record("kueue: created → admitted", time.monotonic() - created, "s")
    assert f"ClusterQueue {CLUSTER_QUEUE}" in admitted["message"], admitted
    running_chief(k8s, namespace, "first", min_step=1)
    figures.record("kueue: created → training", time.monotonic() - created, "s")
    ps = psjobs.live_pods(k8s, namespace, "first", "ps")
    assert all(p["spec"]["nodeSelector"].get("kubernetes.io/os") == "linux" for p in ps), ps

    apply(kubeconfig, namespace, queued_job(namespace, "second", STEPS // 2))
    waiting = wait_for(
        lambda: (
            psjobs.status(k8s, namespace, "second").get("phase") == "Queued"
            and queued_condition(k8s, namespace, "second")
        ),
        timeout=60,
        message="the second job queued",
    )
    assert waiting["status"] == "True" and f"LocalQueue {QUEUE}" in waiting["message"], waiting
    listed = kubectl(kubeconfig, "get", "psjob", "second", "-n", namespace)
    assert "Queued" in listed, listed
    assert not psjobs.live_pods(k8s, namespace, "second", "ps")

    nowhere = queued_job(namespace, "nowhere", STEPS // 2)
    next(d for d in nowhere if d["kind"] == "PSTrainingJob")["metadata"]["labels"][QUEUE_LABEL] = (
        "no-such-queue"
    )
    apply(kubeconfig, namespace, nowhere)
    inadmissible = wait_for(
        lambda: (c := queued_condition(k8s, namespace, "nowhere")) and c["reason"] == "Inadmissible" and c,
        timeout=60,
        message="Kueue's word on a queue that does not exist",
    )
    assert "LocalQueue no-such-queue doesn't exist" in inadmissible["message"], inadmissible

    wait_succeeded(k8s, namespace, "first")
    finished = time.monotonic()
    wait_succeeded(k8s, namespace, "second")
    figures.record("kueue: first Succeeded → second Succeeded", time.monotonic() - finished, "s")
    assert psjobs.status(k8s, namespace, "nowhere")["phase"] == "Queued"  # still, with no pod
    assert not psjobs.live_pods(k8s, namespace, "nowhere", "ps")
    kubectl(kubeconfig, "delete", "psjob", "first", "second", "nowhere", "-n", namespace, "--wait=true")
    wait_for(
        lambda: not workloads(k8s, namespace), timeout=60, message="the Workloads deleted with their jobs"
    )
    assert watch.stop() == 1


def test_a_higher_priority_job_preempts_one_that_checkpoints_first_and_resumes_from_it(
    kubeconfig: Path,
    k8s: client.ApiClient,
    namespace: str,
    queue: str,
    kueue_objects: KueueObjects,
    figures: Figures,
) -> None:
    kueue_objects.create(workload_priority_class("psop-e2e-low", 100))
    kueue_objects.create(workload_priority_class("psop-e2e-high", 1000))
    apply(kubeconfig, namespace, queued_job(namespace, "low", STEPS * 2, priority="psop-e2e-low"))
    chief, _ = running_chief(k8s, namespace, "low", min_step=CHECKPOINT_STEPS + 20)
    last = LastStep(k8s, chief)
    arrived = time.monotonic()
    apply(kubeconfig, namespace, queued_job(namespace, "high", STEPS // 4, priority="psop-e2e-high"))
    wait_for(
        lambda: (
            psjobs.status(k8s, namespace, "low").get("phase") == "Queued"
            and not psjobs.live_pods(k8s, namespace, "low", "chief")
        ),
        timeout=180,
        message="the low job stopped and queued again",
    )
    figures.record("kueue: preemptor created → victim's chief gone", time.monotonic() - arrived, "s")
    stopped_at = last.stop()
    stop = psjobs.status(k8s, namespace, "low")["lastPlannedStop"]
    assert stop["cause"] == "Evicted" and stop["checkpointStep"] >= CHECKPOINT_STEPS, stop
    wait_succeeded(k8s, namespace, "high")
    final = wait_succeeded(k8s, namespace, "low")
    resumed = final["resumedFromStep"]
    assert resumed == stop["checkpointStep"] and final.get("countedRestarts", 0) == 0, final
    lost = stopped_at - resumed
    figures.record("kueue: preempted job's steps lost (last reported minus resumed from)", str(lost))
    assert lost <= 1, (stopped_at, final)

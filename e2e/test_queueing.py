"""A job labelled for a Kueue queue on a cluster without Kueue (this one): it waits, saying why, and
nothing of it runs; the label removed, it runs as any other (queueing with Kueue itself is tested on
the real kubelet, e2e/real/test_kueue.py)."""

from __future__ import annotations

from kubernetes import client

from e2e import psjobs
from e2e.operator_process import OperatorProcess
from e2e.util import condition, holds_for, wait_for

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def test_without_kueue_a_labelled_job_waits_saying_so_and_runs_once_the_label_is_removed(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    body = psjobs.manifest("ctr")
    body["metadata"]["labels"] = {QUEUE_LABEL: "team-a"}
    psjobs.create(k8s, namespace, body)
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Queued", timeout=30)
    queued = condition(status, "Queued")
    assert queued is not None and (queued["status"], queued["reason"]) == ("True", "KueueNotInstalled"), (
        status
    )
    holds_for(
        lambda: not any(psjobs.live_pods(k8s, namespace, "ctr", r) for r in ("chief", "ps", "worker")),
        duration=3,
        message="no pod of a job waiting for Kueue",
    )
    assert operator.running
    patch = {"metadata": {"labels": {QUEUE_LABEL: None}}}
    client.CustomObjectsApi(k8s).patch_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, namespace, psjobs.PLURAL, "ctr", patch
    )
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    assert condition(status, "Queued")["reason"] == "Unqueued", status  # type: ignore[index]
    wait_for(lambda: psjobs.live_pods(k8s, namespace, "ctr", "chief"), timeout=30, message="the chief pod")

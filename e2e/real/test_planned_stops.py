"""Planned stops cost no step, on real kubelets: before a suspend (checkpoints in a bucket: the
in-cluster S3 store of objectstore.py), and when a parameter server is evicted (what `kubectl
drain` does to each pod, through the eviction API), the operator asks the running chief for a
checkpoint (POST /checkpoint) and the next chief resumes from it.

Steps lost: the last step the stopped chief reported (read from its progress port until it stops
answering) minus the step the next chief resumed from. Each test prints it with how long the stop
took (see the table at the end of the run).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e import psjobs
from e2e.real.conftest import Figures
from e2e.real.objectstore import Store, apply_on_s3
from e2e.real.test_training import (
    CHECKPOINT_STEPS,
    LONGER_STEPS,
    LastStep,
    apply_example,
    chief_pods,
    running_chief,
    wait_succeeded,
)
from e2e.util import wait_for

Obj = dict[str, Any]


def events(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    listed = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return list(listed.items)


def training(kubeconfig: Path, k8s: client.ApiClient, namespace: str) -> tuple[str, Obj, LastStep]:
    """The example job, its chief past its first checkpoint, and the watch of that chief's steps."""
    name = apply_example(kubeconfig, namespace, steps=LONGER_STEPS)
    chief, _ = running_chief(k8s, namespace, name, min_step=CHECKPOINT_STEPS + 20)
    return name, chief, LastStep(k8s, chief)


def test_a_suspend_checkpoints_first_and_the_resumed_job_loses_no_step(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, release: str, store: Store, figures: Figures
) -> None:
    """On the bucket: the checkpoint asked before the stop is written to s3, and read back from it."""
    name = apply_on_s3(kubeconfig, namespace, store, f"{namespace}/ctr", LONGER_STEPS)
    chief, _ = running_chief(k8s, namespace, name, min_step=CHECKPOINT_STEPS + 20)
    last = LastStep(k8s, chief)
    asked = time.monotonic()
    psjobs.patch_spec(k8s, namespace, name, {"runPolicy": {"suspend": True}})
    psjobs.wait_phase(k8s, namespace, name, "Suspended", timeout=120)
    wait_for(
        lambda: not psjobs.live_pods(k8s, namespace, name, "chief"), timeout=120, message="the chief gone"
    )
    figures.record("suspend → chief pod gone", time.monotonic() - asked, "s")
    stopped_at = last.stop()
    status = psjobs.status(k8s, namespace, name)
    stop = status["lastPlannedStop"]
    assert stop["cause"] == "Suspend" and stop["checkpointStep"] >= CHECKPOINT_STEPS + 20, status
    suspended = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert f"after the checkpoint at step {stop['checkpointStep']}" in suspended["message"], suspended

    psjobs.patch_spec(k8s, namespace, name, {"runPolicy": {"suspend": False}})
    final = wait_succeeded(k8s, namespace, name)
    resumed = final["resumedFromStep"]
    assert resumed == stop["checkpointStep"] and final.get("countedRestarts", 0) == 0, final
    figures.record("suspend: steps lost (last step reported minus resumed from)", str(stopped_at - resumed))
    assert stopped_at - resumed == 0, (stopped_at, final)
    assert final["checkpoint"]["path"].startswith(f"s3://{store.bucket}/{namespace}/ctr/"), final


def test_an_evicted_parameter_server_is_checkpointed_for_and_its_restart_loses_no_step(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, release: str, figures: Figures
) -> None:
    name, old_chief, last = training(kubeconfig, k8s, namespace)
    ps1 = next(p for p in psjobs.pods(k8s, namespace, name, "ps") if p["metadata"]["name"].endswith("-1"))
    evicted = time.monotonic()
    eviction = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=ps1["metadata"]["name"], namespace=namespace)
    )
    client.CoreV1Api(k8s).create_namespaced_pod_eviction(ps1["metadata"]["name"], namespace, eviction)

    def new_chief() -> Obj | None:
        pods = chief_pods(k8s, namespace, name)
        return next((p for p in pods if p["metadata"]["uid"] != old_chief["metadata"]["uid"]), None)

    wait_for(new_chief, timeout=120, interval=0.2, message="a new chief pod")
    figures.record("PS evicted → new chief pod", time.monotonic() - evicted, "s")
    stopped_at = last.stop()
    final = wait_succeeded(k8s, namespace, name)
    stop = final["lastPlannedStop"]
    assert stop["cause"] == "Drain" and stop["pods"] == [ps1["metadata"]["name"]], final
    resumed = final["resumedFromStep"]
    assert resumed == stop["checkpointStep"] and final.get("countedRestarts", 0) == 0, final
    assert final["restarts"] == 1 and final["step"] == LONGER_STEPS, final
    # Restarted for the PS as soon as the chief answered, not by the chief giving up on it later.
    assert (final["lastFailure"]["role"], final["lastFailure"]["reason"]) == ("ps", "Evicted"), final
    assert "CheckpointedBeforeStop" in [e.reason for e in events(k8s, namespace, name)]
    figures.record(
        "PS evicted: steps lost (last step reported minus resumed from)", str(stopped_at - resumed)
    )
    assert stopped_at - resumed == 0, (stopped_at, final)

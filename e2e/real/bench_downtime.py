"""What each stop costs a training job, on kind with real TensorFlow: a benchmark, not collected by
`pytest e2e/real` (its name is not test_*).

    python -m pytest e2e/real/bench_downtime.py -s

One example job trains on (checkpoints on the shared volume every 100 steps) while it is stopped,
one stop after the other: a parameter server SIGKILLed, a parameter server evicted (the eviction
API, as `kubectl drain` does), the chief's pod deleted, a suspend resumed at once, a resize from 2
to 3 parameter servers. For each, in the table at the end of the run:

- downtime: from the stop to the first step past the one the next chief resumed from (its progress
  port polled every 0.2 s);
- the next chief's own start: from its container's start (the kubelet's startedAt, to the second)
  to that step: TensorFlow's import, connect, restore and first step, which no operator saves. The
  rest of the downtime (the ratio) is what the operator and Kubernetes add;
- steps lost: the last step the stopped chief reported minus the step the next resumed from;
- whether the restart counted against the job's restart budget.

docs/performance.md has the figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e import psjobs
from e2e.kubectl import kubectl
from e2e.real.conftest import Figures
from e2e.real.test_training import (
    CHECKPOINT_STEPS,
    TRAIN_TIMEOUT,
    LastStep,
    apply_example,
    progress,
    running_chief,
    sigkill,
)
from e2e.util import as_json, wait_for

LONG = 1_000_000  # steps: trains for as long as the stops take
Obj = dict[str, Any]


@dataclass(frozen=True)
class Stop:
    name: str
    make: Callable[[client.ApiClient, str, str], None]  # (api, namespace, job name)


def _ps(api: client.ApiClient, namespace: str, name: str, index: int) -> Obj:
    return next(
        p for p in psjobs.live_pods(api, namespace, name, "ps") if p["metadata"]["name"].endswith(f"-{index}")
    )


def _kill_ps(api: client.ApiClient, namespace: str, name: str) -> None:
    sigkill(_ps(api, namespace, name, 0))


def _evict_ps(api: client.ApiClient, namespace: str, name: str) -> None:
    pod = _ps(api, namespace, name, 1)["metadata"]["name"]
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    client.CoreV1Api(api).create_namespaced_pod_eviction(pod, namespace, eviction)


def _delete_chief(api: client.ApiClient, namespace: str, name: str) -> None:
    [chief] = psjobs.live_pods(api, namespace, name, "chief")
    client.CoreV1Api(api).delete_namespaced_pod(chief["metadata"]["name"], namespace)


def _suspend_and_resume(api: client.ApiClient, namespace: str, name: str) -> None:
    psjobs.patch_spec(api, namespace, name, {"runPolicy": {"suspend": True}})
    psjobs.wait_phase(api, namespace, name, "Suspended", timeout=120)
    psjobs.patch_spec(api, namespace, name, {"runPolicy": {"suspend": False}})


def _add_a_ps(api: client.ApiClient, namespace: str, name: str) -> None:
    spec = psjobs.get(api, namespace, name)["spec"]  # type: ignore[index]
    psjobs.patch_spec(api, namespace, name, {"ps": {**spec["ps"], "replicas": spec["ps"]["replicas"] + 1}})


STOPS = (
    Stop("a PS SIGKILLed", _kill_ps),
    Stop("a PS evicted", _evict_ps),
    Stop("the chief's pod deleted", _delete_chief),
    Stop("suspend, resumed at once", _suspend_and_resume),
    Stop("resize 2 → 3 PS", _add_a_ps),
)


def _training_again(api: client.ApiClient, namespace: str, name: str, before: Obj) -> tuple[float, Obj, Obj]:
    """When the chief after `before` first reports a step past the one it resumed from: the time,
    its pod and that report."""

    def past_resumed() -> tuple[float, Obj, Obj] | None:
        for pod in psjobs.live_pods(api, namespace, name, "chief"):
            if pod["metadata"]["uid"] == before["metadata"]["uid"] or not pod["status"].get("podIP"):
                continue
            try:
                report = progress(api, pod)
            except OSError:  # not serving yet
                continue
            resumed = report.get("resumedFromStep")
            if resumed is not None and report.get("step", 0) > resumed:
                return time.time(), pod, report
        return None

    found: tuple[float, Obj, Obj] = wait_for(past_resumed, timeout=TRAIN_TIMEOUT, interval=0.2)
    return found


def _started(api: client.ApiClient, namespace: str, pod: Obj) -> float:
    """When the pod's trainer container started, as the kubelet says (whole seconds)."""
    now = as_json(api, client.CoreV1Api(api).read_namespaced_pod(pod["metadata"]["name"], namespace))
    trainer = next(s for s in now["status"]["containerStatuses"] if s["name"] == "trainer")
    return datetime.fromisoformat(trainer["state"]["running"]["startedAt"]).timestamp()


def test_the_downtime_of_each_stop_against_the_next_chiefs_own_start(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, release: str, figures: Figures
) -> None:
    name = apply_example(kubeconfig, namespace, steps=LONG)
    chief, report = running_chief(k8s, namespace, name, min_step=CHECKPOINT_STEPS + 20)
    for stop in STOPS:
        # Each stop once the chief is past a checkpoint of its own, as training usually is.
        floor_step = (report.get("resumedFromStep") or 0) + CHECKPOINT_STEPS + 20
        chief, report = running_chief(k8s, namespace, name, min_step=floor_step)
        counted = psjobs.status(k8s, namespace, name).get("countedRestarts", 0)
        last = LastStep(k8s, chief)
        stopped = time.time()
        stop.make(k8s, namespace, name)
        again, chief, report = _training_again(k8s, namespace, name, chief)
        lost = last.stop() - report["resumedFromStep"]
        downtime, own = again - stopped, again - _started(k8s, namespace, chief)
        figures.record(f"{stop.name}: downtime", downtime, "s")
        figures.record(f"{stop.name}: the next chief's own start", own, "s")
        figures.record(f"{stop.name}: downtime / own start", f"{downtime / own:.2f}")
        figures.record(f"{stop.name}: steps lost", str(lost))
        now_counted = psjobs.status(k8s, namespace, name).get("countedRestarts", 0)
        figures.record(f"{stop.name}: counted", str(now_counted - counted))
    kubectl(kubeconfig, "delete", "psjob", name, "-n", namespace, "--wait=true", timeout=180)

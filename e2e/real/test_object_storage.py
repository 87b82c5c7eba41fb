"""Checkpoints in a bucket, on real kubelets: the example job with spec.checkpoint.dir s3://..., the
store SeaweedFS's S3 gateway in the cluster (e2e/real/objectstore.py), its credentials a Secret that
the operator hands to the roles that touch the bucket.

- it trains to Succeeded; a SIGKILLed parameter server resumes the job from the bucket's latest
  checkpoint, which status.checkpoint names; deleting the job leaves the checkpoints in the bucket,
  and a second job with the same dir starts from them (a warm start);
- a suspend and a resize from 2 to 3 parameter servers lose no step;
- a bucket that does not exist, or a wrong secret: the chief exits with the configuration code and
  the job fails saying which bucket and what the store answered.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e import psjobs
from e2e.kubectl import kubectl
from e2e.real import example, objectstore
from e2e.real.conftest import Figures
from e2e.real.objectstore import Store
from e2e.real.test_planned_stops import events
from e2e.real.test_training import (
    CHECKPOINT_STEPS,
    STEPS,
    LastStep,
    chief_pods,
    progress,
    restarted_in_place,
    running_chief,
    sigkill,
    wait_succeeded,
)
from e2e.util import wait_for

SECRET = "ctr-s3"
Obj = dict[str, Any]


def apply_on_s3(
    kubeconfig: Path,
    namespace: str,
    store: Store,
    run: str,
    steps: int = STEPS,
    bucket: str | None = None,
    secret_key: str = objectstore.SECRET_KEY,
) -> str:
    """The example job (its claim left out) with its checkpoints in s3://<bucket>/<run>, and the
    Secret it names."""
    job = next(d for d in example.example_manifests(steps) if d["kind"] == "PSTrainingJob")
    job["spec"]["checkpoint"] = {**store.checkpoint(run, SECRET, bucket), "intervalSteps": CHECKPOINT_STEPS}
    secret = store.secret(SECRET, secret_key)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all([secret, job]))
    return str(job["metadata"]["name"])


def test_a_job_checkpoints_to_the_bucket_resumes_from_it_and_leaves_it_for_the_next(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, release: str, store: Store, figures: Figures
) -> None:
    run = f"{namespace}/ctr"
    name = apply_on_s3(kubeconfig, namespace, store, run)
    old_chief, report = running_chief(k8s, namespace, name, min_step=CHECKPOINT_STEPS + 20)
    assert str(report.get("checkpointPath", "")).startswith(f"s3://{store.bucket}/{run}/ckpt-"), report
    ps0 = next(p for p in psjobs.pods(k8s, namespace, name, "ps") if p["metadata"]["name"].endswith("-0"))
    killed = sigkill(ps0)
    wait_for(
        lambda: any(
            p["metadata"]["uid"] != old_chief["metadata"]["uid"] for p in chief_pods(k8s, namespace, name)
        ),
        timeout=120,
        message="a new chief pod",
    )
    restarted_in_place(k8s, namespace, ps0)
    final = wait_succeeded(k8s, namespace, name)
    figures.record("s3: PS SIGKILL → Succeeded", time.monotonic() - killed, "s")
    resumed = final.get("resumedFromStep")
    assert resumed and resumed % CHECKPOINT_STEPS == 0 and final["restarts"] == 1, final
    checkpoint = final["checkpoint"]
    assert (checkpoint["step"], checkpoint["path"]) == (STEPS, f"s3://{store.bucket}/{run}/ckpt-{STEPS}"), (
        final
    )

    kept = objectstore.objects(kubeconfig, store.bucket, run)
    assert "checkpoint" in kept and f"ckpt-{STEPS}.index" in kept, kept
    assert len([n for n in kept if n.endswith(".index")]) <= 3, kept  # the older ones pruned

    kubectl(kubeconfig, "delete", "psjob", name, "-n", namespace, "--wait=true", timeout=180)
    assert objectstore.objects(kubeconfig, store.bucket, run) == kept

    # A new job on the same dir starts where the first ended.
    more = STEPS + 2 * CHECKPOINT_STEPS
    again = apply_on_s3(kubeconfig, namespace, store, run, steps=more)
    warm = wait_succeeded(k8s, namespace, again)
    assert (warm["resumedFromStep"], warm["step"]) == (STEPS, more), warm


def next_chief(api: client.ApiClient, namespace: str, name: str, before: Obj) -> Obj:
    """The report of the chief that follows `before`, once it has restored its checkpoint."""

    def resumed() -> Obj | None:
        for pod in psjobs.live_pods(api, namespace, name, "chief"):
            if pod["metadata"]["uid"] != before["metadata"]["uid"] and pod["status"].get("podIP"):
                try:
                    report = progress(api, pod)
                except OSError:  # not serving yet
                    continue
                if report.get("resumedFromStep") is not None:
                    return report
        return None

    found: Obj = wait_for(resumed, timeout=300, interval=0.5, message="the next chief resumed")
    return found


def test_a_suspend_and_a_resize_on_the_bucket_lose_no_step(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, release: str, store: Store, figures: Figures
) -> None:
    steps = STEPS * 2  # long enough to be stopped twice before it ends
    name = apply_on_s3(kubeconfig, namespace, store, f"{namespace}/ctr", steps=steps)
    chief, _ = running_chief(k8s, namespace, name, min_step=CHECKPOINT_STEPS + 20)
    last = LastStep(k8s, chief)
    psjobs.patch_spec(k8s, namespace, name, {"runPolicy": {"suspend": True}})
    psjobs.wait_phase(k8s, namespace, name, "Suspended", timeout=120)
    wait_for(lambda: not psjobs.live_pods(k8s, namespace, name, "chief"), timeout=120, message="chief gone")
    stopped_at = last.stop()
    stop = psjobs.status(k8s, namespace, name)["lastPlannedStop"]
    psjobs.patch_spec(k8s, namespace, name, {"runPolicy": {"suspend": False}})
    report = next_chief(k8s, namespace, name, chief)
    figures.record("s3: suspend, steps lost", str(stopped_at - report["resumedFromStep"]))
    assert report["resumedFromStep"] == stop["checkpointStep"] == stopped_at, (stop, report)

    chief = psjobs.live_pods(k8s, namespace, name, "chief")[0]
    last = LastStep(k8s, chief)
    spec = psjobs.get(k8s, namespace, name)["spec"]  # type: ignore[index]
    psjobs.patch_spec(k8s, namespace, name, {"ps": {**spec["ps"], "replicas": 3}})
    report = next_chief(k8s, namespace, name, chief)
    stopped_at = last.stop()
    status = psjobs.status(k8s, namespace, name)
    figures.record("s3: resize 2 → 3 PS, steps lost", str(stopped_at - report["resumedFromStep"]))
    assert status["lastPlannedStop"]["cause"] == "Resize" and status["shape"]["ps"] == 3, status
    assert report["resumedFromStep"] == status["lastPlannedStop"]["checkpointStep"] == stopped_at, status
    final = wait_succeeded(k8s, namespace, name)
    assert final["step"] == steps and final.get("countedRestarts", 0) == 0, final


@pytest.mark.parametrize(
    ("bucket", "secret_key", "said"),
    [
        ("no-such-bucket", objectstore.SECRET_KEY, "bucket no-such-bucket does not exist"),
        (objectstore.BUCKET, "not-the-secret", "SignatureDoesNotMatch"),
    ],
    ids=["a missing bucket", "a wrong secret"],
)
def test_storage_that_is_not_there_fails_the_job_saying_why(
    kubeconfig: Path,
    k8s: client.ApiClient,
    namespace: str,
    release: str,
    store: Store,
    bucket: str,
    secret_key: str,
    said: str,
) -> None:
    name = apply_on_s3(kubeconfig, namespace, store, f"{namespace}/bad", bucket=bucket, secret_key=secret_key)
    psjobs.wait_phase(k8s, namespace, name, "Failed", timeout=300)
    status = psjobs.status(k8s, namespace, name)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PermanentExitCode" and "exit code 2" in failed["message"], failed
    assert "checkpoint storage s3://" in failed["message"] and said in failed["message"], failed
    told = [e.message for e in events(k8s, namespace, name) if said in (e.message or "")]
    assert told, f"no event says {said!r}"
    assert "not-the-secret" not in str(status) and objectstore.SECRET_KEY not in str(status)

"""Checkpoints in a bucket, on real kubelets: the example job with spec.checkpoint.dir s3://..., the
store SeaweedFS's S3 gateway in the cluster (e2e/real/objectstore.py), its credentials a Secret that
the operator hands to the roles that touch the bucket. A suspend (test_planned_stops.py) and a
resize (test_resize.py) run on the bucket too.

- it trains to Succeeded; a SIGKILLed parameter server resumes the job from the bucket's latest
  checkpoint, which status.checkpoint names; deleting the job leaves the checkpoints in the bucket,
  and a second job with the same dir starts from them (a warm start);
- a bucket that does not exist, or a wrong secret: the chief exits with the configuration code and
  the job fails saying which bucket and what the store answered.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e import psjobs
from e2e.kubectl import kubectl
from e2e.real import objectstore
from e2e.real.conftest import Figures
from e2e.real.objectstore import Store, apply_on_s3
from e2e.real.test_planned_stops import events
from e2e.real.test_training import (
    CHECKPOINT_STEPS,
    STEPS,
    chief_pods,
    restarted_in_place,
    running_chief,
    sigkill,
    wait_succeeded,
)
from e2e.util import wait_for

Obj = dict[str, Any]


def test_a_job_checkpoints_to_the_bucket_resumes_from_it_and_leaves_it_for_the_next(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, release: str, store: Store, figures: Figures
) -> None:
    run = f"{namespace}/ctr"
    name = apply_on_s3(kubeconfig, namespace, store, run, STEPS)
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
    run = f"{namespace}/bad"
    name = apply_on_s3(kubeconfig, namespace, store, run, STEPS, bucket=bucket, secret_key=secret_key)
    psjobs.wait_phase(k8s, namespace, name, "Failed", timeout=300)
    status = psjobs.status(k8s, namespace, name)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PermanentExitCode" and "exit code 2" in failed["message"], failed
    assert "checkpoint storage s3://" in failed["message"] and said in failed["message"], failed
    told = [e.message for e in events(k8s, namespace, name) if said in (e.message or "")]
    assert told, f"no event says {said!r}"
    assert "not-the-secret" not in str(status) and objectstore.SECRET_KEY not in str(status)

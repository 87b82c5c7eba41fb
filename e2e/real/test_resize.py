"""Live resize on real kubelets: one training job resized twice while it trains, every direction
once (2 → 3 PS with 2 → 4 workers, then 3 → 2 PS with 4 → 1 worker), with its embedding
partitioned one shard per parameter server, so a PS resize reshards the checkpoint (in a bucket:
the in-cluster S3 store of objectstore.py). Each resize: a
checkpoint, then a restart with the new shape that counts nothing; the new chief resumes from the
resize's checkpoint and its loss goes on from where it was. Prints, per resize, request → training
again, steps lost and the loss before and after (see the table at the end of the run).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e import psjobs
from e2e.real.conftest import Figures
from e2e.real.objectstore import Store, apply_on_s3
from e2e.real.test_training import CHECKPOINT_STEPS, TRAIN_TIMEOUT, LastStep, progress, wait_succeeded
from e2e.util import wait_for

STEPS = 2000
# Steps a new shape trains before the next resize: enough for a loss to compare.
TRAINED_BETWEEN = 100
RESIZES = [(3, 4), (2, 1)]
Obj = dict[str, Any]


def apply_resharding_example(kubeconfig: Path, namespace: str, store: Store) -> str:
    """The example job, its embedding in one shard per parameter server (`--partitioner=fixed`), its
    checkpoints in the bucket; without its evaluator (two cores: it would only slow the resizes)."""
    run, args = f"{namespace}/ctr", ("--partitioner=fixed",)
    return apply_on_s3(kubeconfig, namespace, store, run, STEPS, args=args, evaluator=False)


def chief_of(
    api: client.ApiClient, namespace: str, name: str, attempt: int, min_step: int
) -> tuple[Obj, Obj]:
    """The chief pod of `attempt` once it reports at least `min_step`, with that report."""

    def reported() -> tuple[Obj, Obj] | None:
        for pod in psjobs.live_pods(api, namespace, name, "chief"):
            if pod["metadata"]["labels"].get(psjobs.LABEL_ATTEMPT) != str(attempt) or not pod["status"].get(
                "podIP"
            ):
                continue
            try:
                report = progress(api, pod)
            except OSError:  # not serving yet
                continue
            if report.get("step", 0) >= min_step and report.get("loss") is not None:
                return pod, report
        return None

    return wait_for(
        reported, timeout=TRAIN_TIMEOUT, interval=0.5, message=f"chief {attempt} at step {min_step}"
    )


@pytest.mark.timeout(1200)
def test_a_training_job_is_resized_up_and_down_losing_no_step(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, release: str, store: Store, figures: Figures
) -> None:
    name = apply_resharding_example(kubeconfig, namespace, store)
    _, first = chief_of(k8s, namespace, name, 0, 20)
    initial_loss = first["loss"]
    chief, report = chief_of(k8s, namespace, name, 0, CHECKPOINT_STEPS + 20)
    shape = (2, 2)
    for attempt, (ps, workers) in enumerate(RESIZES, start=1):
        last, before = LastStep(k8s, chief), report
        spec = psjobs.get(k8s, namespace, name)["spec"]  # type: ignore[index]
        asked = time.monotonic()
        psjobs.patch_spec(
            k8s,
            namespace,
            name,
            {"ps": {**spec["ps"], "replicas": ps}, "worker": {**spec["worker"], "replicas": workers}},
        )
        chief, report = chief_of(k8s, namespace, name, attempt, 1)
        took = time.monotonic() - asked
        stopped_at = last.stop()
        resumed = report["resumedFromStep"]
        change = f"{shape[0]} → {ps} PS, {shape[1]} → {workers} workers"
        figures.record(f"resize {change}: request → training again", took, "s")
        figures.record(f"resize {change}: steps lost", str(stopped_at - resumed))
        figures.record(f"resize {change}: loss before, after (initial {initial_loss:.3f})",
                       f"{before['loss']:.3f}, {report['loss']:.3f}")  # fmt: skip
        status = psjobs.status(k8s, namespace, name)
        assert (status["shape"]["ps"], status["shape"]["workers"]) == (ps, workers), status
        assert status["lastPlannedStop"]["cause"] == "Resize" and status["countedRestarts"] == 0, status
        assert resumed == status["lastPlannedStop"]["checkpointStep"] and stopped_at == resumed, status
        shape = (ps, workers)
        chief, report = chief_of(k8s, namespace, name, attempt, resumed + TRAINED_BETWEEN)
    final = wait_succeeded(k8s, namespace, name)
    assert final["step"] == STEPS and final["restarts"] == len(RESIZES) and final["countedRestarts"] == 0, (
        final
    )
    assert "lastFailure" not in final, final

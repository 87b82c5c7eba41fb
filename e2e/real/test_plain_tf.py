"""A plain TensorFlow program (examples/plain-tf: Keras `fit` under ParameterServerStrategy, no code
of ours in the image) trains for real and survives a parameter server SIGKILLed mid-training: the
operator replaces the chief, whose BackupAndRestore callback resumes from the last epoch's backup.

The image has no progress port: the operator learns of no step, and the chief's own log is what
shows where it resumed.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from e2e import psjobs
from e2e.kubectl import kubectl
from e2e.real import example
from e2e.real.conftest import Figures
from e2e.real.test_training import chief_pods, sigkill, wait_succeeded
from e2e.util import wait_for

EPOCHS = 8
# Keras prints "Epoch N/EPOCHS" as each epoch starts; the backup is written as each one ends.
EPOCH = re.compile(rf"^Epoch (\d+)/{EPOCHS}$", re.MULTILINE)


def epochs_started(api: client.ApiClient, namespace: str, pod: str) -> list[int]:
    log = client.CoreV1Api(api).read_namespaced_pod_log(pod, namespace, container="trainer")
    return [int(n) for n in EPOCH.findall(log)]


def test_a_plain_tensorflow_job_resumes_from_its_keras_backup_after_a_ps_sigkill(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, release: str, figures: Figures
) -> None:
    started = time.monotonic()
    docs = example.plain_tf_manifests(namespace, EPOCHS)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    name = next(d["metadata"]["name"] for d in docs if d["kind"] == "PSTrainingJob")
    psjobs.wait_phase(k8s, namespace, name, "Running", timeout=180)
    [old_chief] = chief_pods(k8s, namespace, name)
    chief_name = old_chief["metadata"]["name"]
    # Epoch 3 has started: the backups of epochs 1 and 2 are written.
    wait_for(lambda: max(epochs_started(k8s, namespace, chief_name), default=0) >= 3, timeout=300,
             interval=1, message=f"{chief_name} in its third epoch")  # fmt: skip
    figures.record("plain TF: apply → third epoch", time.monotonic() - started, "s")
    epoch_at_kill = max(epochs_started(k8s, namespace, chief_name))
    ps0 = next(p for p in psjobs.pods(k8s, namespace, name, "ps") if p["metadata"]["name"].endswith("-0"))
    killed = sigkill(ps0)

    def new_chief() -> dict[str, Any] | None:
        pods = chief_pods(k8s, namespace, name)
        return next((p for p in pods if p["metadata"]["uid"] != old_chief["metadata"]["uid"]), None)

    chief = wait_for(new_chief, timeout=120, interval=0.1, message="a new chief pod")
    figures.record("plain TF: PS SIGKILL → new chief pod", time.monotonic() - killed, "s")

    final = wait_succeeded(k8s, namespace, name)
    figures.record("plain TF: PS SIGKILL → Succeeded", time.monotonic() - killed, "s")
    assert final["restarts"] == 1 and final["lastFailure"]["role"] == "ps", final
    resumed = epochs_started(k8s, namespace, chief["metadata"]["name"])
    # The new chief starts after the last backup (the epoch under way at the kill may have ended
    # before TensorFlow saw the PS gone), not at epoch 1, and trains to the end.
    assert resumed and epoch_at_kill <= resumed[0] <= EPOCHS and resumed[-1] == EPOCHS, resumed
    figures.record("plain TF: epoch under way at the kill, first epoch of the new chief",
                   f"{epoch_at_kill}, {resumed[0]}")  # fmt: skip

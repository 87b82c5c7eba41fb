"""The example's checkpoint saved and restored in the bucket and on a volume, one after the other
on kind: a benchmark, not collected by `pytest e2e/real` (its name is not test_*).

    python -m pytest e2e/real/bench_storage.py -s

The figures come at the end, with the session's others; docs/how-to/object-storage.md has them.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.kubectl import kubectl
from e2e.real.conftest import Figures
from e2e.real.objectstore import Store, apply_on_s3
from e2e.real.test_training import CHECKPOINT_STEPS, STEPS, apply_example, chief_pods, wait_succeeded

Obj = dict[str, Any]


def chief_log_seconds(kubeconfig: Path, namespace: str, pod: Obj, pattern: str) -> list[float]:
    """The seconds in each of a chief's log lines that `pattern` (one group) matches."""
    text = kubectl(kubeconfig, "logs", "-n", namespace, pod["metadata"]["name"], "-c", "trainer")
    return [float(seconds) for seconds in re.findall(pattern, text)]


SAVED = r"checkpoint at step \d+: \S+ \(([0-9.]+) s\)"
RESTORED = r"resumed from step \d+ \(checkpoint \S+, ([0-9.]+) s\)"


def test_save_and_restore_times_on_the_bucket_and_on_a_volume(
    kubeconfig: Path, k8s: client.ApiClient, namespace: str, release: str, store: Store, figures: Figures
) -> None:
    """The example's checkpoint saved every 100 steps, then restored by a warm start, in the bucket
    and on the hostPath volume that stands in for a ReadWriteMany claim, one after the other."""
    for storage in ("s3", "volume"):
        if storage == "s3":
            name = apply_on_s3(kubeconfig, namespace, store, f"{namespace}/timed", STEPS)
        else:
            name = apply_example(kubeconfig, namespace)
        wait_succeeded(k8s, namespace, name)
        saves = chief_log_seconds(kubeconfig, namespace, chief_pods(k8s, namespace, name)[-1], SAVED)
        kubectl(kubeconfig, "delete", "psjob", name, "-n", namespace, "--wait=true", timeout=180)
        if storage == "s3":
            name = apply_on_s3(
                kubeconfig, namespace, store, f"{namespace}/timed", steps=STEPS + CHECKPOINT_STEPS
            )
        else:
            name = apply_example(kubeconfig, namespace, steps=STEPS + CHECKPOINT_STEPS)
        warm = wait_succeeded(k8s, namespace, name)
        assert warm["resumedFromStep"] == STEPS, warm
        restores = chief_log_seconds(kubeconfig, namespace, chief_pods(k8s, namespace, name)[-1], RESTORED)
        kubectl(kubeconfig, "delete", "psjob", name, "-n", namespace, "--wait=true", timeout=180)
        assert saves and len(restores) == 1, (saves, restores)
        figures.record(f"checkpoint save on {storage}: median of {len(saves)}", statistics.median(saves), "s")
        figures.record(f"checkpoint restore on {storage}", restores[0], "s")

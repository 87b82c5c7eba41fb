"""The PSTrainingJob the TensorFlow tests run, as a user would write it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

JOB_NAME, NAMESPACE = "ctr", "team-a"
# Short enough for a test to wait it out, long enough for the chief to save meanwhile.
PS_DRAIN_SECONDS = 6
# Tiny model: tests exercise the contract, not the throughput.
TINY_MODEL = ["--vocab-size=20000", "--embedding-dim=8", "--batch-size=64", "--max-shard-bytes=40000"]


def ctr_job(
    checkpoint_dir: Path,
    chief_args: list[str],
    *,
    interval_steps: int = 100,
    connect_timeout_seconds: int = 120,
    model: Sequence[str] = TINY_MODEL,
    ps: int = 2,
    workers: int = 2,
) -> dict[str, Any]:
    """A PSTrainingJob as a user would write it: 2 ps, 2 workers (unless told), an evaluator, the
    example's flags."""

    def template(args: list[str] | None = None, env: dict[str, str] | None = None) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "trainer"}
        if args:
            container["args"] = args
        if env:
            container["env"] = [{"name": k, "value": v} for k, v in env.items()]
        return {"spec": {"containers": [container]}}

    spec: dict[str, Any] = {
        "image": "ps-training-operator/trainer:0.1.0",
        "chief": {"template": template([*chief_args, *model])},
        "ps": {
            "replicas": ps,
            "template": template(env={"PSTRAINER_PS_DRAIN_SECONDS": str(PS_DRAIN_SECONDS)}),
        },
        "worker": {"replicas": workers, "template": template()},
        "checkpoint": {"dir": str(checkpoint_dir), "intervalSteps": interval_steps},
        "failurePolicy": {"connectTimeoutSeconds": connect_timeout_seconds},
        "evaluator": {"template": template([*chief_args, *model])},
    }
    return {
        "apiVersion": "psoperator.io/v1alpha1",
        "kind": "PSTrainingJob",
        "metadata": {"name": JOB_NAME, "namespace": NAMESPACE, "uid": "0f1e2d3c-0000-4000-8000-000000000001"},
        "spec": spec,
    }

"""examples/ctr-job.yaml (and examples/plain-tf/job.yaml) as they run on this machine's one real
node, for the tests and e2e/demo.sh.

The examples are applied as a user would, with three changes a 2-core machine needs: the locally
built image, small resource requests (the examples ask for whole cores and GiB per role), and
fewer steps. Its checkpoint claim binds to a hostPath PersistentVolume made here: on one node every
pod shares it, as a ReadWriteMany volume from a storage class (NFS, EFS, Filestore) does on a real
cluster.

    python -m e2e.real.example --namespace NS [--steps N] [--ttl S] | kubectl apply -n NS -f -
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from e2e.paths import CACHE

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "ctr-job.yaml"
PLAIN_TF_EXAMPLE = REPO / "examples" / "plain-tf" / "job.yaml"
VOLUMES = CACHE / "real" / "volumes"
TRAINER_IMAGE = os.environ.get("PSOPERATOR_TRAINER_IMAGE", "ps-training-operator/trainer:dev")
PLAIN_TF_IMAGE = os.environ.get("PSOPERATOR_PLAIN_TF_IMAGE", "ps-training-operator/plain-tf:dev")
CHECKPOINT_STEPS = 100
MEMORY = {"chief": "512Mi", "ps": "1Gi", "worker": "512Mi", "evaluator": "256Mi"}
Obj = dict[str, Any]


def _small(template: Obj, memory: str) -> None:
    for container in template["spec"]["containers"]:
        resources = container.setdefault("resources", {})
        resources["requests"] = {"cpu": "100m", "memory": memory}
        resources["limits"] = {k: v for k, v in resources.get("limits", {}).items() if k != "memory"}


def _for_this_machine(path: Path, image: str, arg: str) -> tuple[list[Obj], Obj]:
    """An example's documents (the claim, the job) with this machine's image and sizes, and the
    chief's `--NAME=` argument replaced by `arg`; and the job's spec."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    spec = next(d for d in docs if d["kind"] == "PSTrainingJob")["spec"]
    spec["image"] = image
    chief = spec["chief"]["template"]["spec"]["containers"][0]
    option = arg.split("=", 1)[0] + "="
    chief["args"] = [a for a in chief.get("args", []) if not a.startswith(option)] + [arg]
    for role, memory in MEMORY.items():
        if role in spec:
            _small(spec[role]["template"], memory)
    return docs, spec


def example_manifests(
    steps: int, ttl: int | None = None, checkpoint_steps: int = CHECKPOINT_STEPS
) -> list[Obj]:
    """examples/ctr-job.yaml's documents with this machine's image, sizes and steps."""
    docs, spec = _for_this_machine(EXAMPLE, TRAINER_IMAGE, f"--steps={steps}")
    spec["checkpoint"]["intervalSteps"] = checkpoint_steps
    if ttl is not None:
        spec.setdefault("runPolicy", {})["ttlSecondsAfterFinished"] = ttl
    return docs


def shared_volume(namespace: str, claim: str) -> Obj:
    """A hostPath PersistentVolume reserved for `claim` (a directory the trainer's uid can write)."""
    path = VOLUMES / namespace / claim
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)  # the trainer runs as uid 10001
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"{namespace}-{claim}", "labels": {"psoperator.io/e2e": "true"}},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }


def with_volumes(namespace: str, docs: list[Obj]) -> list[Obj]:
    """What to apply: the volume for each of the documents' claims, then the documents."""
    claims = [d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"]
    return [*(shared_volume(namespace, claim) for claim in claims), *docs]


def manifests(
    namespace: str, steps: int, ttl: int | None = None, checkpoint_steps: int = CHECKPOINT_STEPS
) -> list[Obj]:
    """What to apply for examples/ctr-job.yaml."""
    return with_volumes(namespace, example_manifests(steps, ttl, checkpoint_steps))


def plain_tf_manifests(namespace: str, epochs: int) -> list[Obj]:
    """What to apply for examples/plain-tf/job.yaml, trained for `epochs` epochs."""
    docs, _ = _for_this_machine(PLAIN_TF_EXAMPLE, PLAIN_TF_IMAGE, f"--epochs={epochs}")
    return with_volumes(namespace, docs)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--ttl", type=int, default=None)
    args = parser.parse_args()
    yaml.safe_dump_all(manifests(args.namespace, args.steps, args.ttl), sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()

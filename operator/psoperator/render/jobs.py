"""batch/v1 Jobs: the chief, which runs to completion, and the optional evaluator."""

from __future__ import annotations

from psoperator.api.labels import LABEL_ATTEMPT
from psoperator.api.models import PSTrainingJobSpec
from psoperator.api.names import child_labels, child_name, pod_hostname
from psoperator.contract import Role
from psoperator.render.pod import Manifest, trainer_container_name

# The fields we render that the API server lets change in an existing Job. The rest (the pod
# template, completions, podFailurePolicy) is immutable: a change of it waits for the next Job,
# because re-applying it would be refused (422) at every reconcile.
JOB_MUTABLE_SPEC = frozenset({"suspend", "parallelism", "backoffLimit"})


def _job(job_name: str, namespace: str, role: Role, pod_template: Manifest, suspend: bool) -> Manifest:
    pod_template["spec"]["hostname"] = pod_hostname(job_name, role, 0)
    pod_template["spec"]["subdomain"] = child_name(job_name, role)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": child_name(job_name, role),
            "namespace": namespace,
            "labels": child_labels(job_name, role),
        },
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "suspend": suspend,
            "template": pod_template,
        },
    }


def render_chief_job(
    spec: PSTrainingJobSpec,
    job_name: str,
    namespace: str,
    pod_template: Manifest,
    *,
    attempt: int,
    suspend: bool,
) -> Manifest:
    """The chief's Job for one attempt.

    Retries belong to the operator, not to the Job controller: they must be immediate (the Job
    controller backs off 10 s, 20 s, 40 s ...), coordinated with the parameter servers and counted
    against a budget that progress resets. So backoffLimit is 0 and every retry is a new Job, whose
    attempt label tells it apart. The pod failure policy still lets the Job say why it failed
    (FailJob on a permanent exit code) and lets disruptions (eviction, preemption) be retried by the
    Job controller itself without counting.
    """
    job = _job(job_name, namespace, Role.CHIEF, pod_template, suspend)
    job["metadata"]["labels"][LABEL_ATTEMPT] = str(attempt)
    # The first matching rule decides, so disruptions come first: an evicted or preempted chief
    # whose code exits 1 on SIGTERM must be retried, not failed as if it had a bug.
    rules: list[Manifest] = [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]
    codes = sorted(set(spec.failure_policy.permanent_exit_codes))
    if codes:
        # Only the trainer's exit code: a sidecar killed with the pod may exit with any code.
        exit_codes: Manifest = {"operator": "In", "values": codes}
        trainer = trainer_container_name(pod_template)
        if trainer is not None:
            exit_codes = {"containerName": trainer, **exit_codes}
        rules.append({"action": "FailJob", "onExitCodes": exit_codes})
    job["spec"].update(
        {
            "backoffLimit": 0,
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": {"rules": rules},
        }
    )
    return job


def render_evaluator_job(
    spec: PSTrainingJobSpec, job_name: str, namespace: str, pod_template: Manifest, *, suspend: bool
) -> Manifest:
    """The evaluator follows checkpoints; its own failures are retried in place by the kubelet."""
    job = _job(job_name, namespace, Role.EVALUATOR, pod_template, suspend)
    job["spec"]["backoffLimit"] = spec.failure_policy.max_restarts
    return job

"""Pure renderers: a PSTrainingJob in, the manifests of its children out.

No I/O, no clock, no environment: the same job and options always give identical manifests, so
re-rendering never causes a spurious update. Each manifest carries a hash of what of it may change
after creation (`changeable`), which the apply layer compares with the live object's to patch only
what changed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from psoperator import GROUP, KIND, VERSION
from psoperator.api.labels import ANNOTATION_HASH
from psoperator.api.models import Admission, PSTrainingJobSpec, Shape
from psoperator.api.names import CHIEF_TOKEN_KEY, chief_token_secret_name, job_labels
from psoperator.api.shape import requested, with_shape
from psoperator.contract import DEFAULT_PROGRESS_PORT, Role
from psoperator.render.jobs import JOB_MUTABLE_SPEC, render_chief_job, render_evaluator_job
from psoperator.render.networkpolicy import render_network_policies
from psoperator.render.pod import Manifest, render_pod_template, role_templates
from psoperator.render.services import render_service
from psoperator.render.statefulsets import render_statefulset
from psoperator.render.tfconfig import cluster_spec, fits_environment, render_tf_config_map, tf_config
from psoperator.render.workload import pod_set, render_workload, with_admission

__all__ = ["Manifest", "RenderOptions", "changeable", "render_chief_token", "render_children", "spec_hash"]


@dataclass(frozen=True)
class RenderOptions:
    """What the operator decided, beyond the spec, about the children it wants."""

    cluster_domain: str = "cluster.local"
    # Coordinated restarts so far: each restart is a new chief Job with this attempt label.
    attempt: int = 0
    # Suspended: no pod of any role runs, and there is no chief Job: a suspended Job whose pod is
    # still stopping when it is resumed counts that pod's exit as a failure (backoffLimit 0), so a
    # quick resume would fail the chief; a resumed job gets a new Job of the same attempt.
    suspended: bool = False
    # Finished and cleaned: parameter servers, workers and evaluator stop; the chief Job stays as it ended.
    stopped: bool = False
    # Failed while the chief still ran (the deadline, a PS that never started): its Job is suspended,
    # which deletes its pod, so it does not train on against stopped parameter servers.
    chief_stopped: bool = False
    # The operator's own namespace, which alone may read the chief's progress port; None (run out of
    # cluster without --operator-namespace): no namespace may.
    operator_namespace: str | None = None
    # The labels of the operator's own pods there, (name, value) sorted: only they may; none: any pod
    # of the namespace may.
    operator_pod_labels: tuple[tuple[str, str], ...] = ()
    # The parameter servers, workers and PS resources of the attempt that runs (status.shape), when
    # the spec asks for others: a resize waits for its checkpoint, then a new attempt gets the new shape.
    shape: Shape | None = None
    # A queued job (the label kueue.x-k8s.io/queue-name): its Workload waits in this LocalQueue,
    # with this WorkloadPriorityClass and value.
    queue: str | None = None
    priority: tuple[str, int] | None = None
    # What Kueue's admission puts on each role's pods (status.admission).
    admission: Admission | None = None


def changeable(manifest: Manifest) -> Manifest:
    """What of a manifest may change once its object exists: all of it, but a Job's mutable fields
    only, and nothing of a Workload's spec.

    A chief Job keeps the template and podFailurePolicy it was created with (a changed
    permanentExitCodes, a new operator version): the next attempt's Job gets the new ones.
    """
    if manifest.get("kind") == "Workload":  # queueName, pod sets, priority: a new Workload's
        return {k: v for k, v in manifest.items() if k != "spec"}
    if manifest.get("kind") != "Job":
        return manifest
    spec = {k: v for k, v in manifest.get("spec", {}).items() if k in JOB_MUTABLE_SPEC}
    return {**manifest, "spec": spec}


def spec_hash(manifest: Manifest) -> str:
    """A hash of what may change: equal hashes, nothing to patch; so no patch is ever refused and retried."""
    body = {k: v for k, v in changeable(manifest).items() if k != "metadata"}
    meta = {k: v for k, v in manifest.get("metadata", {}).items() if k != "annotations"}
    text = json.dumps({"metadata": meta, **body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _owner_reference(job: Manifest) -> Manifest:
    meta = job["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _finish(manifest: Manifest, owner: Manifest) -> Manifest:
    meta = manifest["metadata"]
    meta["ownerReferences"] = [owner]
    meta["annotations"] = {**meta.get("annotations", {}), ANNOTATION_HASH: spec_hash(manifest)}
    return manifest


def render_children(job: Manifest, options: RenderOptions | None = None, **overrides: Any) -> list[Manifest]:
    """Every child of a job: Services, the ps and worker StatefulSets, the chief Job, the evaluator Job,
    the NetworkPolicies unless spec.networkPolicy.enabled is false, and a queued job's Workload."""
    opts = options or RenderOptions(**overrides)
    spec = PSTrainingJobSpec.model_validate(job["spec"])
    if opts.shape is not None:
        spec = with_shape(spec, opts.shape)
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    replicas = {Role.CHIEF: 1, Role.PS: spec.ps.replicas, Role.WORKER: spec.worker.replicas}
    cluster = cluster_spec(name, namespace, replicas, spec.port, opts.cluster_domain)
    inline = fits_environment(cluster)
    token_secret = chief_token_secret_name(name, job["metadata"]["uid"])
    templates = _pod_templates(spec, name, cluster if inline else None, opts.attempt, token_secret)
    # The ConfigMap first: pods that mount it wait for it.
    children: list[Manifest] = (
        [] if inline else [render_tf_config_map(name, namespace, replicas, spec.port, opts.cluster_domain)]
    )
    children += [render_service(name, namespace, role, spec.port) for role in templates]
    if opts.queue is not None:
        counts = {**replicas, Role.EVALUATOR: 1}
        pod_sets = [pod_set(role, counts[role], template) for role, template in templates.items()]
        shape = requested(spec)  # the spec as the running attempt has it
        children.append(render_workload(name, namespace, opts.queue, shape, pod_sets, opts.priority))
    if opts.admission is not None:
        templates = {role: with_admission(t, opts.admission.of(role.value)) for role, t in templates.items()}
    children += _workloads_of(spec, name, namespace, replicas, templates, opts)
    if spec.network_policy.enabled:
        # The renderer gives every chief DEFAULT_PROGRESS_PORT as its PSOP_PROGRESS_PORT.
        port, progress = spec.port, DEFAULT_PROGRESS_PORT
        children += render_network_policies(
            name, namespace, port, progress, opts.operator_namespace, opts.operator_pod_labels
        )
    owner = _owner_reference(job)
    return [_finish(child, owner) for child in children]


def render_chief_token(job: Manifest, token: str) -> Manifest:
    """The Secret holding the job's chief token, which the chief's trainer mounts (pod.py): made
    with each chief Job, never read back nor changed (the token of a job never changes)."""
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": chief_token_secret_name(name, job["metadata"]["uid"]),
            "namespace": namespace,
            "labels": job_labels(name, "chief-token"),
            "ownerReferences": [_owner_reference(job)],
        },
        "type": "Opaque",
        # The kubelet need not watch it for changes.
        "immutable": True,
        "stringData": {CHIEF_TOKEN_KEY: token},
    }


_RESTART_POLICIES = {
    Role.CHIEF: "Never",
    Role.PS: "Always",
    Role.WORKER: "Always",
    Role.EVALUATOR: "OnFailure",
}


def _pod_templates(
    spec: PSTrainingJobSpec, name: str, cluster: dict[str, list[str]] | None, attempt: int, token_secret: str
) -> dict[Role, Manifest]:
    """Each role's pod template; with `cluster`, the TF_CONFIG inline (else from the ConfigMap); the
    chief's mounts the Secret `token_secret`."""
    templates = {}
    for role, template in role_templates(spec).items():
        one = role in (Role.CHIEF, Role.EVALUATOR)  # a Job's one pod: its task index is 0
        config = tf_config(cluster, role, 0 if one else None) if cluster is not None else None
        templates[role] = render_pod_template(
            spec,
            name,
            role,
            template,
            config,
            index=0 if one else None,
            restart_policy=_RESTART_POLICIES[role],
            attempt=attempt if role is Role.CHIEF else None,
            token_secret=token_secret if role is Role.CHIEF else None,
        )
    return templates


def _workloads_of(
    spec: PSTrainingJobSpec,
    name: str,
    namespace: str,
    replicas: dict[Role, int],
    templates: dict[Role, Manifest],
    opts: RenderOptions,
) -> list[Manifest]:
    """The StatefulSets and Jobs that run the pods."""
    workers_run = not (opts.suspended or opts.stopped)
    children = [
        render_statefulset(name, namespace, role, replicas[role] if workers_run else 0, templates[role])
        for role in (Role.PS, Role.WORKER)
    ]
    if not opts.suspended:
        chief = render_chief_job(
            spec, name, namespace, templates[Role.CHIEF], attempt=opts.attempt, suspend=opts.chief_stopped
        )
        children.append(chief)
    if Role.EVALUATOR in templates:
        evaluator = templates[Role.EVALUATOR]
        children.append(render_evaluator_job(spec, name, namespace, evaluator, suspend=not workers_run))
    return children

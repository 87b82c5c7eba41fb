"""A queued job's Kueue Workload (queueing.py): one pod set per role, with its rendered pod template
(Kueue sums their requests), the LocalQueue and the priority.

Its name carries the shape (status.shape): a resize (replicas, PS resources) asks for other
requests, so it is a new Workload, queued again, and the old one is deleted first (never two of
one job at once). Nothing else of it changes once it exists (render.changeable): Kueue refuses
changes to an admitted Workload's pod sets, and an operator upgrade that renders other templates
must not evict a job.
"""

from __future__ import annotations

import copy
import hashlib
import json

from psoperator.api.models import PodSetAdmission, Shape
from psoperator.api.names import job_labels
from psoperator.contract import Role
from psoperator.render.pod import Manifest

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"


def workload_name(job_name: str, shape: Shape) -> str:
    """E.g. ctr-2ps-4w, and a hash of the PS containers' resources when they set any (a change
    of them is a resize too: other requests)."""
    name = f"{job_name}-{shape.ps}ps-{shape.workers}w"
    if not shape.ps_resources:
        return name
    resources = {k: v.model_dump(exclude_none=True) for k, v in shape.ps_resources.items()}
    digest = hashlib.sha256(json.dumps(resources, sort_keys=True).encode()).hexdigest()[:5]
    return f"{name}-{digest}"


def pod_set(role: Role, count: int, template: Manifest) -> Manifest:
    """One role's pod set: its template as its pods get it before their admission."""
    return {"name": role.value, "count": count, "template": copy.deepcopy(template)}


def render_workload(
    job_name: str,
    namespace: str,
    queue: str,
    shape: Shape,
    pod_sets: list[Manifest],
    priority: tuple[str, int] | None = None,
) -> Manifest:
    """The Workload of a job that waits in `queue`; `priority` is the WorkloadPriorityClass the
    job names (LABEL_PRIORITY_CLASS) and its value."""
    spec: Manifest = {"queueName": queue, "podSets": pod_sets}
    if priority is not None:
        name, value = priority
        spec["priorityClassRef"] = {"group": GROUP, "kind": "WorkloadPriorityClass", "name": name}
        spec["priority"] = value
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job_name, shape),
            "namespace": namespace,
            "labels": job_labels(job_name, "workload"),
        },
        "spec": spec,
    }


def with_admission(template: Manifest, admitted: PodSetAdmission | None) -> Manifest:
    """A role's pod template as its admission places it (Kueue's podset.Merge): the flavors' node
    labels and tolerations, the admission checks' labels and annotations; the admission's wins
    where the template says otherwise."""
    if admitted is None:
        return template
    template = copy.deepcopy(template)
    meta, pod = template.setdefault("metadata", {}), template.setdefault("spec", {})
    for key, added in (("labels", admitted.labels), ("annotations", admitted.annotations)):
        if added:
            meta[key] = {**meta.get(key, {}), **added}
    if admitted.node_selector:
        pod["nodeSelector"] = {**pod.get("nodeSelector", {}), **admitted.node_selector}
    tolerations = pod.get("tolerations", [])
    for toleration in admitted.tolerations:
        wanted = toleration.model_dump(by_alias=True, exclude_none=True)
        if wanted not in tolerations:
            tolerations = [*tolerations, wanted]
    if tolerations:
        pod["tolerations"] = tolerations
    return template

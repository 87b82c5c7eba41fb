"""Typed, read-only views of the children the operator observes, parsed from raw API objects.

Parsing is forgiving: a field that is missing or of an odd type reads as "unknown", never as an
exception, so an unexpected object cannot crash a reconcile.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from psoperator.api.labels import ANNOTATION_TRAINER_CONTAINER, LABEL_ATTEMPT, LABEL_ROLE
from psoperator.api.names import child_name
from psoperator.contract import Role
from psoperator.fields import dict_of as _dict
from psoperator.fields import int_of as _int
from psoperator.fields import list_of as _list
from psoperator.fields import str_of as _str
from psoperator.managed_fields import folds
from psoperator.observe.workload import KueueView, WorkloadView, parse_workload
from psoperator.timeutil import format_time, parse_time

Obj = dict[str, Any]
# The kept objects' strings shorter than this are interned (interned): names of keys, labels, kinds,
# roles, phases; longer ones (a message, a container's command) are seldom the same in two jobs.
INTERN_BELOW = 64

# Waiting reasons after which a container will never start without a change of spec.
START_ERRORS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
    }
)


@dataclass(frozen=True)
class Termination:
    exit_code: int | None
    reason: str
    message: str = ""
    finished_at: str | None = None


def _termination(state: Any) -> Termination | None:
    terminated = _dict(_dict(state).get("terminated"))
    if not terminated:
        return None
    return Termination(
        exit_code=_int(terminated.get("exitCode")),
        reason=str(terminated.get("reason") or "Error"),
        message=str(terminated.get("message") or ""),
        finished_at=_str(terminated.get("finishedAt")),
    )


@dataclass(frozen=True)
class Unscheduled:
    """A pod's PodScheduled=False condition: why (Unschedulable, SchedulingGated), the scheduler's
    message and since when (the condition's lastTransitionTime)."""

    reason: str
    message: str
    since: str | None


def _unscheduled(conditions: list[Obj]) -> Unscheduled | None:
    scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), {})
    if scheduled.get("status") != "False":
        return None
    return Unscheduled(
        reason=str(scheduled.get("reason") or "Unschedulable"),
        message=str(scheduled.get("message") or ""),
        since=_str(scheduled.get("lastTransitionTime")),
    )


# An owner reference, as (kind, name, uid).
OwnerRef = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class PodView:
    """What the operator reads of a pod: parsed once, when the watch or a fresh read delivers it."""

    name: str
    uid: str
    role: Role | None
    index: int | None
    phase: str
    ready: bool
    restarts: int  # of the training container; sidecars' are in sidecar_restarts
    deleting: bool
    attempt: int | None = None
    ip: str | None = None
    node: str | None = None
    # The training container's current termination (pod failed/succeeded) or last one (restarted in place).
    terminated: Termination | None = None
    last_terminated: Termination | None = None
    waiting_reason: str | None = None
    waiting_message: str = ""
    disruption: str | None = None  # reason of a DisruptionTarget=True condition
    disrupted_at: str | None = None  # and since when
    deleted_at: str | None = None  # when its deletion was asked (deletionTimestamp less the grace period)
    deletion_grace: int | None = None  # the grace period it is being deleted with
    pod_reason: str | None = None  # status.reason, e.g. Evicted
    created: str | None = None
    # Restart counts of the other containers (istio-proxy, fluent-bit, ...), by name.
    sidecar_restarts: dict[str, int] = field(default_factory=dict)
    unscheduled: Unscheduled | None = None  # the scheduler has not placed it yet, and says why
    node_lost: str | None = None  # set by the plan: why its node counts as lost (it is force-deleted)
    owners: tuple[OwnerRef, ...] = ()
    version: int = 0  # resource_version()

    @property
    def running(self) -> bool:
        return self.phase == "Running" and not self.deleting

    @property
    def failed(self) -> bool:
        return self.phase == "Failed"


_INDEX_LABELS = ("apps.kubernetes.io/pod-index", "batch.kubernetes.io/job-completion-index")


def _index_of(meta: Obj, name: str) -> int | None:
    labels = _dict(meta.get("labels"))
    for key in _INDEX_LABELS:
        index = _int(labels.get(key))
        if index is not None:
            return index
    return _int(name.rsplit("-", 1)[-1])


def _trainer_name(meta: Obj, spec: Obj) -> str | None:
    """The training container: named by the renderer's annotation, else the pod spec's first container.

    The fallback is for pods rendered before the annotation existed; the spec keeps the template's
    order (a webhook may still have put its proxy first, which is why the renderer names it).
    """
    named = _dict(meta.get("annotations")).get(ANNOTATION_TRAINER_CONTAINER)
    if isinstance(named, str) and named:
        return named
    first = next((c for c in _list(spec.get("containers")) if isinstance(c, dict)), {})
    name = first.get("name")
    return name if isinstance(name, str) else None


def parse_pod(pod: Obj) -> PodView:
    meta, status = _dict(pod.get("metadata")), _dict(pod.get("status"))
    labels = _dict(meta.get("labels"))
    name = str(meta.get("name", ""))
    role_value = labels.get(LABEL_ROLE)
    role = Role(role_value) if isinstance(role_value, str) and role_value in Role._value2member_map_ else None
    statuses = [s for s in _list(status.get("containerStatuses")) if isinstance(s, dict)]
    # By name, never by position: the kubelet sorts statuses by container name, so a sidecar called
    # fluent-bit comes before the trainer.
    trainer_name = _trainer_name(meta, _dict(pod.get("spec")))
    trainer = next((s for s in statuses if s.get("name") == trainer_name), {})
    sidecars = [s for s in statuses if s is not trainer]
    conditions = [c for c in _list(status.get("conditions")) if isinstance(c, dict)]
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    disruption = next(
        (c for c in conditions if c.get("type") == "DisruptionTarget" and c.get("status") == "True"), None
    )
    # Any container: a sidecar whose image never pulls keeps the pod from running as surely.
    waiting = next(
        (
            _dict(_dict(s.get("state")).get("waiting"))
            for s in statuses
            if _dict(_dict(s.get("state")).get("waiting"))
        ),
        {},
    )
    return PodView(
        name=name,
        uid=str(meta.get("uid", "")),
        role=role,
        index=_index_of(meta, name),
        phase=str(status.get("phase") or "Pending"),
        ready=ready,
        restarts=_int(trainer.get("restartCount")) or 0,
        deleting=bool(meta.get("deletionTimestamp")),
        attempt=_int(labels.get(LABEL_ATTEMPT)),
        ip=_str(status.get("podIP")) or None,
        node=_str(_dict(pod.get("spec")).get("nodeName")),
        terminated=_termination(trainer.get("state")),
        last_terminated=_termination(trainer.get("lastState")),
        waiting_reason=_str(waiting.get("reason")),
        waiting_message=str(waiting.get("message") or ""),
        disruption=str(disruption.get("reason") or "Disrupted") if disruption else None,
        disrupted_at=_str(disruption.get("lastTransitionTime")) if disruption else None,
        deleted_at=_deletion_asked(meta),
        deletion_grace=_int(meta.get("deletionGracePeriodSeconds"))
        if meta.get("deletionTimestamp")
        else None,
        pod_reason=_str(status.get("reason")),
        created=_str(meta.get("creationTimestamp")),
        sidecar_restarts={str(s.get("name")): _int(s.get("restartCount")) or 0 for s in sidecars},
        unscheduled=_unscheduled(conditions),
        owners=tuple(
            (str(r.get("kind")), str(r.get("name")), str(r.get("uid")))
            for r in _list(meta.get("ownerReferences"))
            if isinstance(r, dict)
        ),
        version=resource_version(meta),
    )


def resource_version(meta: Obj) -> int:
    """The object's resourceVersion as a number: etcd's revision, which every version of an object
    and every write's response carries. The API contract calls it opaque, so a value that is not a
    number orders as 0 (then the latest to arrive wins)."""
    return _int(meta.get("resourceVersion")) or 0


def _deletion_asked(meta: Obj) -> str | None:
    """When the pod's deletion was asked: the API server sets deletionTimestamp that far ahead."""
    deadline = parse_time(_str(meta.get("deletionTimestamp")))
    if deadline is None:
        return None
    try:
        return format_time(deadline - timedelta(seconds=_int(meta.get("deletionGracePeriodSeconds")) or 0))
    except OverflowError:  # a grace period beyond the calendar: when it was asked is unknown
        return None


@dataclass(frozen=True)
class JobView:
    """A batch/v1 Job (the chief's or the evaluator's)."""

    name: str
    uid: str
    attempt: int | None
    succeeded: bool
    failed: bool
    failure_reason: str | None
    failure_message: str
    active: int
    suspended: bool
    deleting: bool
    completion_time: str | None  # status.completionTime, set by the Job controller on success


def parse_job(job: Obj) -> JobView:
    meta, spec, status = _dict(job.get("metadata")), _dict(job.get("spec")), _dict(job.get("status"))
    conditions = {
        c["type"]: c for c in _list(status.get("conditions")) if isinstance(_dict(c).get("type"), str)
    }
    failed = _dict(conditions.get("Failed"))
    complete = _dict(conditions.get("Complete"))
    return JobView(
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        attempt=_int(_dict(meta.get("labels")).get(LABEL_ATTEMPT)),
        succeeded=complete.get("status") == "True",
        failed=failed.get("status") == "True",
        failure_reason=_str(failed.get("reason")),
        failure_message=str(failed.get("message") or ""),
        active=_int(status.get("active")) or 0,
        suspended=bool(spec.get("suspend")),
        deleting=bool(meta.get("deletionTimestamp")),
        completion_time=_str(status.get("completionTime")),
    )


# Set on a node known to be down (by an admin or a fencing controller): Kubernetes' non-graceful
# node shutdown (KEP-2268). Its pods may then be force-deleted: none of their containers runs.
TAINT_OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


@dataclass(frozen=True)
class NodeView:
    """A node's Ready condition ("True", "False", or "Unknown": its kubelet stopped reporting), since
    when, and whether it is tainted out of service."""

    name: str
    ready: str
    since: str | None
    out_of_service: bool = False


def parse_node(node: Obj) -> NodeView:
    conditions = [c for c in _list(_dict(node.get("status")).get("conditions")) if isinstance(c, dict)]
    ready = next((c for c in conditions if c.get("type") == "Ready"), {})
    taints = [t for t in _list(_dict(node.get("spec")).get("taints")) if isinstance(t, dict)]
    return NodeView(
        name=str(_dict(node.get("metadata")).get("name", "")),
        ready=str(ready.get("status") or "Unknown"),
        since=_str(ready.get("lastTransitionTime")),
        out_of_service=any(t.get("key") == TAINT_OUT_OF_SERVICE for t in taints),
    )


@dataclass(frozen=True)
class Observed:
    """Everything one reconcile knows about a job's children."""

    pods: list[PodView] = field(default_factory=list)
    chief_job: JobView | None = None
    children: dict[tuple[str, str], Obj] = field(default_factory=dict)  # (kind, name) -> object
    # The last state the watch showed of pods that failed or went away (uid -> view): a pod that is
    # replaced between two reconciles is still classified by what really happened to it.
    departed: dict[str, PodView] = field(default_factory=dict)
    # The nodes of the job's pods, by name, from the node index (None: the node object is gone).
    nodes: dict[str, NodeView | None] = field(default_factory=dict)
    # A queued job's Workload (the first by name if several are left), and what was read of Kueue.
    workload: WorkloadView | None = None
    kueue: KueueView | None = None
    # Pods of an earlier job of the same name that still hold the names, and so the addresses, of
    # this job's parameter servers and workers (former_pods).
    former: list[PodView] = field(default_factory=list)

    def role_pods(self, role: Role) -> list[PodView]:
        return sorted(
            (p for p in self.pods if p.role is role), key=lambda p: (p.index is None, p.index, p.name)
        )

    def running(self, role: Role) -> list[PodView]:
        """The role's pods that run and are not going away."""
        return [p for p in self.role_pods(role) if p.running]

    def current_pods(self, attempt: int) -> list[PodView]:
        """The current attempt's chief pod, then every pod of the other roles."""
        chief = self.chief_pod(attempt)
        others = [p for role in Role if role is not Role.CHIEF for p in self.role_pods(role)]
        return [*([chief] if chief is not None else []), *others]

    def former_chiefs(self, attempt: int) -> list[PodView]:
        """Chief pods whose containers may still run (being deleted or not) that the current
        attempt's chief Job does not own: of other attempts, and of this one whose Job is gone
        (deleted by a suspension, a queue's stop or a user; the garbage collector has not removed
        its pods yet) or has another uid. A pod whose Job the reconcile has not seen yet is one of
        them too: the new Job waits, and it is deleted only once its Job is known gone
        (PodDeletion.orphan_of)."""
        return [
            p
            for p in self.role_pods(Role.CHIEF)
            if not self._of_current_job(p, attempt) and p.phase not in ("Succeeded", "Failed")
        ]

    def current_chief_job(self, attempt: int) -> JobView | None:
        """The chief Job of this attempt (being deleted or not); None while only an older one exists."""
        job = self.chief_job
        return job if job is not None and job.attempt == attempt else None

    def _of_current_job(self, pod: PodView, attempt: int) -> bool:
        """The pod is of this attempt's chief Job, by the Job's uid: a resumed job's new Job has the
        attempt and the name of the deleted one, whose pod may still run."""
        job = self.current_chief_job(attempt)
        return pod.attempt == attempt and job is not None and chief_job_of(pod) == (job.name, job.uid)

    def chief_pods(self, attempt: int) -> list[PodView]:
        """The pods of the current attempt's chief Job, whatever their phase."""
        return [p for p in self.role_pods(Role.CHIEF) if self._of_current_job(p, attempt)]

    def chief_pod(self, attempt: int) -> PodView | None:
        """The newest live pod of the current attempt's chief Job."""
        return max(self.chief_pods(attempt), key=lambda p: (not p.deleting, p.created or ""), default=None)

    def last_chief_pod(self, attempt: int) -> PodView | None:
        """The attempt's chief pod, or the last state the watch showed of it once it is gone (a real
        kubelet removes a deleted pod right after its container exits)."""
        gone = (
            p for p in self.departed.values() if p.role is Role.CHIEF and self._of_current_job(p, attempt)
        )
        return self.chief_pod(attempt) or max(gone, key=lambda p: p.created or "", default=None)


def chief_job_of(pod: PodView) -> tuple[str, str] | None:
    """The (name, uid) of the Job that owns a chief pod."""
    return next(((name, uid) for kind, name, uid in pod.owners if kind == "Job"), None)


def build_observed(
    children: list[Obj], pods: list[PodView], job_name: str, departed: dict[str, PodView]
) -> Observed:
    """What one reconcile works from: the job's own children (kind set on each), of the pods that
    carry its labels those of its children (owned_pods) and those of an earlier job of its name
    (former_pods)."""
    chief_name = child_name(job_name, Role.CHIEF)
    chief_job = next(
        (parse_job(c) for c in children if c["kind"] == "Job" and c["metadata"]["name"] == chief_name), None
    )
    workloads = sorted((c for c in children if c["kind"] == "Workload"), key=lambda c: c["metadata"]["name"])
    owners = {str(c["metadata"].get("uid")) for c in children}
    return Observed(
        pods=owned_pods(pods, owners, job_name),
        chief_job=chief_job,
        children={(c["kind"], c["metadata"]["name"]): c for c in children},
        departed=departed,
        workload=parse_workload(workloads[0]) if workloads else None,
        former=former_pods(pods, owners, job_name),
    )


def owned_pods(pods: list[PodView], owner_uids: set[str], job_name: str) -> list[PodView]:
    """The pods of the job's own StatefulSets and Jobs (a pod that merely carries the labels is not),
    and the pods of its older chief Jobs: the old Job is deleted before its pod has stopped, and that
    pod must still be seen, so that a new chief waits for it."""
    chief_name = child_name(job_name, Role.CHIEF)

    def ours(pod: PodView) -> bool:
        older_chief = any(kind == "Job" and name == chief_name for kind, name, _ in pod.owners)
        return older_chief or any(uid in owner_uids for _, _, uid in pod.owners)

    return [p for p in pods if ours(p)]


def former_pods(pods: list[PodView], owner_uids: set[str], job_name: str) -> list[PodView]:
    """The pods named as the job's StatefulSets name theirs (<job>-ps-0, <job>-worker-1) that its
    StatefulSets do not own and that have not ended: those of an earlier job of the same name, just
    deleted, still stopping (a parameter server drains on SIGTERM). They answer at the addresses of
    this job's parameter servers and workers, and its StatefulSets cannot make theirs meanwhile."""
    addressed = {child_name(job_name, role) for role in (Role.PS, Role.WORKER)}

    def former(pod: PodView) -> bool:
        base, _, index = pod.name.rpartition("-")
        return (
            base in addressed
            and index.isdigit()
            and pod.phase not in ("Succeeded", "Failed")
            and not any(uid in owner_uids for _, _, uid in pod.owners)
        )

    return [p for p in pods if former(p)]


def _metadata(obj: Obj) -> Obj:
    """The object's metadata without managedFields."""
    return {k: v for k, v in _dict(obj.get("metadata")).items() if k != "managedFields"}


def interned(value: Any) -> Any:
    """`value` rebuilt with its strings shorter than INTERN_BELOW interned, keys too: the keys, labels,
    kinds and roles of every job's kept objects are then one copy each (a slim Service: 3.8 -> 1.5 KiB).
    Only plain strings: sys.intern refuses a subclass (a StrEnum)."""
    if isinstance(value, dict):
        return {sys.intern(k) if type(k) is str else k: interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [interned(item) for item in value]
    if type(value) is str and len(value) < INTERN_BELOW:
        return sys.intern(value)
    return value


def slim_job(job: Obj) -> Obj:
    """A PSTrainingJob as the operator keeps it: whole, but for its managedFields; interned."""
    kept: Obj = interned({**job, "metadata": _metadata(job)})
    return kept


def slim_child(obj: Obj) -> Obj:
    """What the operator reads of a child (Service, StatefulSet, Job, ConfigMap, NetworkPolicy): its
    kind, metadata (of its managedFields only which Update entries an apply must fold first, without
    their fields: managed_fields.py), status and, of a Job, whether it is suspended, of a
    StatefulSet, its replicas (whether a change makes pods: plan/children.py). The rest of the spec
    (pod templates with TF_CONFIG) and a ConfigMap's data are left out: a child is compared with the
    rendered one by its hash annotation (plan/children.py). Interned, as a job is."""
    kept: Obj = {"kind": obj.get("kind"), "metadata": _metadata(obj), "status": _dict(obj.get("status"))}
    if obj.get("kind") == "Job":
        kept["spec"] = {"suspend": _dict(obj.get("spec")).get("suspend")}
    elif obj.get("kind") == "StatefulSet":
        kept["spec"] = {"replicas": _dict(obj.get("spec")).get("replicas")}
    slim: Obj = interned(kept)
    managed = _dict(obj.get("metadata")).get("managedFields") or []
    updates = sorted({entry["manager"] for entry in managed if folds(entry)})
    if updates:  # which ones, not their fields: a patch reads those fresh
        slim["metadata"]["managedFields"] = [_update_entry(manager) for manager in updates]
    return slim


@functools.cache
def _update_entry(manager: str) -> Obj:
    """An Update entry of a slim child's managedFields: one, never changed, for all children."""
    return {"manager": manager, "operation": "Update"}


def owned_by(obj: Obj, uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(isinstance(r, dict) and r.get("uid") == uid for r in refs)

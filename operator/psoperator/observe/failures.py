"""Failure classification: what happened to a pod, as observed, told as a `Failure`.

Only the training container's exit codes and restarts count (views.py finds it by name); a
sidecar's restart is a failure of its own kind, recorded and never acted on. A pod that went away
between two reconciles is classified by its last state the watch showed (`departed`), else as
Replaced or Deleted. What the operator does about a failure is policies/recovery.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

from psoperator.api.models import TrackedPod
from psoperator.contract import ExitCode, Role
from psoperator.observe.views import PodView, Termination

# Roles whose pods the operator tracks from one reconcile to the next (the chief has its Job).
TRACKED_ROLES = (Role.PS, Role.WORKER, Role.EVALUATOR)

# DisruptionTarget reasons, as Kubernetes sets them, to the reason users know.
DISRUPTION_REASONS = {
    "PreemptionByScheduler": "Preempted",
    "PreemptionByKubeScheduler": "Preempted",
    "EvictionByEvictionAPI": "Evicted",
    "TerminationByKubelet": "Evicted",
    "DeletionByTaintManager": "NodeLost",
    "DeletionByPodGC": "NodeLost",
}


@dataclass(frozen=True)
class Failure:
    """One failure of one pod, as the recovery record and the events tell it."""

    role: Role
    pod: str
    index: int | None
    reason: str
    message: str
    exit_code: int | None = None
    disruption: bool = False
    sidecar: bool = False  # a sidecar restarted, not the trainer: recorded, never acted on
    # When it happened (the container's termination, the pod's disruption or deletion), if the
    # API says; recovery time is measured from it.
    at: str | None = None

    def describe(self) -> str:
        where = f"{self.role.value} {self.index}" if self.index is not None else self.role.value
        code = f" (exit code {self.exit_code})" if self.exit_code is not None else ""
        text = f"{where} ({self.pod}): {self.reason}{code}"
        return f"{text}: {self.message}" if self.message else text


def _sidecar_failure(pod: PodView) -> Failure:
    assert pod.role is not None
    restarted = ", ".join(
        f"{name} ({count})" for name, count in sorted(pod.sidecar_restarts.items()) if count
    )
    message = f"sidecar restarted in place, restarts so far: {restarted}; the trainer runs on"
    return Failure(pod.role, pod.name, pod.index, "SidecarRestarted", message, sidecar=True)


def _termination_failure(pod: PodView, term: Termination | None, fallback: str) -> Failure:
    assert pod.role is not None
    if term is None:
        return Failure(pod.role, pod.name, pod.index, fallback, "", at=pod.deleted_at)
    # SIGTERM: someone asked the pod to stop (a deletion, a drain); the task did nothing wrong.
    stopped = term.exit_code == ExitCode.TERMINATED
    message = term.message.strip()[:512]
    return Failure(
        pod.role,
        pod.name,
        pod.index,
        term.reason,
        message,
        term.exit_code,
        disruption=stopped,
        at=term.finished_at,
    )


def _disruption(
    role: Role, name: str, index: int | None, target: str, at: str | None = None, source: str = ""
) -> Failure:
    """A pod the cluster marked as a disruption target (`target`: the condition's reason) that ended."""
    reason = DISRUPTION_REASONS.get(target, "Disrupted")
    return Failure(role, name, index, reason, f"DisruptionTarget: {target}{source}", disruption=True, at=at)


def _disrupted(pod: PodView) -> Failure:
    assert pod.role is not None and pod.disruption is not None
    return _disruption(pod.role, pod.name, pod.index, pod.disruption, at=pod.disrupted_at)


def _classify_ended(pod: PodView) -> Failure | None:
    """A pod that failed, is being deleted, or was seen last in one of those states."""
    assert pod.role is not None
    if pod.node_lost is not None:
        return Failure(pod.role, pod.name, pod.index, "NodeLost", pod.node_lost, disruption=True)
    if pod.disruption is not None and (pod.failed or pod.deleting):
        return _disrupted(pod)
    if pod.failed:
        if pod.pod_reason == "Evicted":
            at = pod.terminated.finished_at if pod.terminated else None
            return Failure(pod.role, pod.name, pod.index, "Evicted", "", disruption=True, at=at)
        return _termination_failure(pod, pod.terminated, pod.pod_reason or "Failed")
    if pod.deleting:
        return Failure(pod.role, pod.name, pod.index, "Deleted", "the pod was deleted", at=pod.deleted_at)
    return None


def _gone_unseen(previous: TrackedPod, role: Role, name: str, index: int | None, replaced: bool) -> Failure:
    """A tracked pod gone (replaced by a new one of its name, or not yet) and the watch did not show
    how it ended: a disruption when one was seen on it and recorded in status.tracking."""
    if previous.disruption is not None:
        return _disruption(role, name, index, previous.disruption, source=" (recorded in status.tracking)")
    if replaced:
        return Failure(role, name, index, "Replaced", "the pod was replaced by a new one")
    return Failure(role, name, index, "Deleted", "the pod disappeared")


def classify_pod_failure(
    previous: TrackedPod | None, pod: PodView | None, departed: dict[str, PodView] | None = None
) -> Failure | None:
    """What happened to a tracked pod since the last reconcile, or None if nothing did.

    `previous` is how the pod under this name was tracked; `pod` is what is there now (None:
    nothing); `departed` holds the last state seen of pods that ended, by uid.
    """
    if previous is None:
        return None
    uid, restarts, sidecar_restarts = previous.uid, previous.restarts, previous.sidecar_restarts
    if pod is None or pod.uid != uid:
        last = (departed or {}).get(uid)
        if last is not None and last.role is not None:
            # It is gone: marked as a disruption target when last seen, that is how it ended.
            ended = _classify_ended(last) or (_disrupted(last) if last.disruption else None)
            if ended is not None:
                return ended
        if pod is None or pod.role is None:
            return None
        return _gone_unseen(previous, pod.role, pod.name, pod.index, replaced=True)
    if pod.role is None:
        return None
    ended = _classify_ended(pod)
    if ended is not None:
        return ended
    if pod.restarts > restarts:
        return _termination_failure(pod, pod.last_terminated, "Restarted")
    if sidecar_restarts is not None and sum(pod.sidecar_restarts.values()) > sidecar_restarts:
        return _sidecar_failure(pod)
    return None


def unexplained(
    tracking: dict[str, TrackedPod], pods: list[PodView], departed: dict[str, PodView]
) -> set[str]:
    """Tracked pods that are gone without the watch having shown how they ended (yet)."""
    live = {p.uid for p in pods}
    uids = {entry.uid for entry in tracking.values()}
    return {uid for uid in uids if uid not in live and uid not in departed}


def detect_failures(
    tracking: dict[str, TrackedPod], pods: list[PodView], departed: dict[str, PodView] | None = None
) -> list[Failure]:
    """Failures of tracked parameter server and worker pods, including pods that vanished."""
    by_name = {p.name: p for p in pods}
    failures: list[Failure] = []
    for name, previous in sorted(tracking.items()):
        pod = by_name.get(name)
        failure = classify_pod_failure(previous, pod, departed)
        if failure is None and pod is None:
            # StatefulSet pods are named <job>-<role>-<ordinal>.
            _, role_text, index_text = ["", "", "", *name.rsplit("-", 2)][-3:]
            role = Role(role_text) if role_text in TRACKED_ROLES else Role.WORKER
            index = int(index_text) if index_text.isdigit() else None
            failure = _gone_unseen(previous, role, name, index, replaced=False)
        if failure is not None:
            failures.append(failure)
    return failures


def chief_failure(pod: PodView | None, job_reason: str | None, job_message: str) -> Failure:
    """Why the chief failed, from its last pod, else from its Job's reason."""
    if pod is None:
        return Failure(Role.CHIEF, "", 0, job_reason or "Failed", job_message)
    if pod.node_lost is not None:
        return Failure(Role.CHIEF, pod.name, 0, "NodeLost", pod.node_lost, disruption=True)
    if pod.disruption is not None:
        reason = DISRUPTION_REASONS.get(pod.disruption, "Disrupted")
        return Failure(Role.CHIEF, pod.name, 0, reason, pod.disruption, disruption=True, at=pod.disrupted_at)
    return _termination_failure(pod, pod.terminated, job_reason or "Failed")

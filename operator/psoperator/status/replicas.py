"""Status computed from observed children: replica counts and the phase they add up to."""

from __future__ import annotations

from psoperator.api.models import PSTrainingJobSpec, ReplicaStatus
from psoperator.api.vocabulary import Phase
from psoperator.contract import Role
from psoperator.observe.views import Observed


def replica_statuses(
    spec: PSTrainingJobSpec,
    observed: Observed,
    previous: dict[str, ReplicaStatus],
    new_failures: dict[Role, int],
    attempt: int,
) -> dict[str, ReplicaStatus]:
    desired = {Role.CHIEF: 1, Role.PS: spec.ps.replicas, Role.WORKER: spec.worker.replicas}
    if spec.evaluator is not None:
        desired[Role.EVALUATOR] = 1
    result: dict[str, ReplicaStatus] = {}
    for role, want in desired.items():
        pods = observed.chief_pods(attempt) if role is Role.CHIEF else observed.role_pods(role)
        before = previous.get(role.value, ReplicaStatus())
        result[role.value] = ReplicaStatus(
            desired=want,
            ready=sum(1 for p in pods if p.ready and not p.deleting),
            running=sum(1 for p in pods if p.running),
            succeeded=sum(1 for p in pods if p.phase == "Succeeded"),
            failed=sum(1 for p in pods if p.failed),
            restarts=before.restarts + new_failures.get(role, 0),
        )
    return result


def ready_of(replicas: ReplicaStatus) -> str:
    """Ready/desired, as `kubectl get` shows it (psReady, workersReady)."""
    return f"{replicas.ready}/{replicas.desired}"


def all_running(spec: PSTrainingJobSpec, observed: Observed, attempt: int) -> bool:
    """The chief of the current attempt, every parameter server and every worker run."""
    workers_up = len(observed.running(Role.WORKER)) == spec.worker.replicas
    return chief_and_ps_run(spec, observed, attempt) and workers_up


def chief_and_ps_run(spec: PSTrainingJobSpec, observed: Observed, attempt: int) -> bool:
    """What training needs: the chief of the current attempt and every parameter server run."""
    chief = observed.chief_pod(attempt)
    return chief is not None and chief.running and _ps_up(spec, observed)


def _ps_up(spec: PSTrainingJobSpec, observed: Observed) -> bool:
    return len(observed.running(Role.PS)) == spec.ps.replicas


def running_phase(spec: PSTrainingJobSpec, observed: Observed, attempt: int, restarting: bool) -> Phase:
    """Phase of a job that is neither finished nor suspended. A chief whose pod completed keeps the
    job Running until its Job says so (then the success policy finishes the job): the job does not
    go through Creating on its way to Succeeded."""
    if not observed.children:
        return Phase.PENDING
    chief = observed.chief_pod(attempt)
    if chief is not None and (chief.running or chief.phase == "Succeeded") and _ps_up(spec, observed):
        return Phase.RUNNING
    return Phase.RESTARTING if restarting else Phase.CREATING

"""The chaos run: many small jobs, each driven through a scenario by its own thread, while
the active one of two operator replicas is SIGKILLed and restarted and kube-apiserver restarts; a
sampler watches for two chiefs of one job at once (of two attempts, or of two Jobs), for chief Jobs
made twice and for twin pods of one chief Job, and records the memory of every operator process and
who holds the replicas' Lease.

Twin pods of one chief Job are the Job controller's, not the operator's: when kube-apiserver
restarts while the controller creates the pod (generateName), the response can be lost after the
pod was stored; the controller creates another, then deletes the one too many once it sees both
(seen in kube-controller-manager's log as FailedCreate "connection reset by peer", then two pods
of the Job started by KWOK at the same instant). The operator never makes a chief Job while another
chief runs; it cannot make the Job controller's creates idempotent.

Every scenario starts the same way (created, Running with its parameter servers established) and
ends in a terminal state the scenario knows in advance, with a known number of restarts:

  succeed    the chief completes                                  Succeeded, 0 restarts
  ps         PS 0 fails (exit 138), then the chief completes      Succeeded, 1
  worker     worker 1 fails (exit 138, retryable), then completes Succeeded, 0 (workers restart alone)
  chief      the chief fails (exit 138), its next attempt completes  Succeeded, 1
  permanent  the chief exits 2 (a permanent exit code)            Failed, 0
  suspend    suspended, resumed, then the chief completes         Succeeded, 0
  delete     deleted while running                                gone

Pod failures and completions are injected through e2e/chaos.py on KWOK's simulated nodes. Every API
call of a scenario is retried until its deadline: the API server is restarted under it.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e import chaos, psjobs
from e2e.leases import Handovers
from e2e.util import as_json, rss_mib, wait_for
from psoperator.control.leader import LeaseRecord

Obj = dict[str, Any]
# One step of a scenario (e.g. Running again after a restart) while the leader is killed every
# ~10 s and the API server restarts: generous, a stuck job still fails the run.
STEP_TIMEOUT = 90.0
POLL = 0.5
RETRYABLE_EXIT, PERMANENT_EXIT = 138, 2


class Kind(enum.StrEnum):
    SUCCEED = "succeed"
    PS = "ps"
    WORKER = "worker"
    CHIEF = "chief"
    PERMANENT = "permanent"
    SUSPEND = "suspend"
    DELETE = "delete"


# The phase each kind ends in (None: deleted) and the restarts it must have counted.
EXPECTED: dict[Kind, tuple[str | None, int]] = {
    Kind.SUCCEED: ("Succeeded", 0),
    Kind.PS: ("Succeeded", 1),
    Kind.WORKER: ("Succeeded", 0),
    Kind.CHIEF: ("Succeeded", 1),
    Kind.PERMANENT: ("Failed", 0),
    Kind.SUSPEND: ("Succeeded", 0),
    Kind.DELETE: (None, 0),
}
# Most succeed; the mix repeats for as many jobs as the run has.
MIX = (
    Kind.SUCCEED, Kind.PS, Kind.WORKER, Kind.SUCCEED, Kind.CHIEF,
    Kind.SUSPEND, Kind.SUCCEED, Kind.DELETE, Kind.PERMANENT, Kind.PS,
)  # fmt: skip


def scenarios(count: int) -> list[tuple[str, Kind]]:
    return [(f"job-{i:03d}", MIX[i % len(MIX)]) for i in range(count)]


@dataclass
class Outcome:
    name: str
    kind: Kind
    seconds: float = 0.0
    error: str | None = None


# --- one job's scenario ---------------------------------------------------------------------


def _retry(action: Callable[[], object], what: str) -> None:
    """Runs `action` until it returns without raising (it must be safe to repeat)."""

    def attempt() -> bool:
        action()
        return True

    wait_for(attempt, timeout=STEP_TIMEOUT, interval=1.0, message=what)


def _status_until(api: client.ApiClient, ns: str, name: str, holds: Callable[[Obj], bool], what: str) -> Obj:
    def reached() -> Obj | None:
        current = psjobs.status(api, ns, name)
        return current if holds(current) else None

    return wait_for(
        reached,
        timeout=STEP_TIMEOUT,
        interval=POLL,
        message=lambda: f"{name}: {what}; status {psjobs.status(api, ns, name)}",
    )


def _running(api: client.ApiClient, ns: str, name: str) -> Obj:
    return _status_until(
        api,
        ns,
        name,
        lambda s: s.get("phase") == "Running" and bool((s.get("tracking") or {}).get("psEstablished")),
        "Running with its parameter servers established",
    )


def _tracked(status: Obj, pod: Obj) -> bool:
    """The operator tracks this very pod (status.tracking)."""
    entry = psjobs.tracked(status).get(pod["metadata"]["name"])
    return entry is not None and entry.uid == pod["metadata"]["uid"]


def _running_pod(api: client.ApiClient, ns: str, name: str, role: str, index: int = 0) -> Obj:
    """The Running pod of the task; for the chief, of the attempt the status names. A PS or worker
    pod only once the operator tracks it: one that fails before is not a failure it could count
    (its replacement is the first it sees), and a leader killed at that moment makes that likely."""

    def find() -> Obj | None:
        status = psjobs.status(api, ns, name)
        attempt = str(status.get("restarts") or 0)
        for pod in psjobs.live_pods(api, ns, name, role):
            labels = pod["metadata"]["labels"]
            ordinal = labels.get("apps.kubernetes.io/pod-index", "0")
            if role == "chief":
                ours = labels.get(psjobs.LABEL_ATTEMPT) == attempt
            else:
                ours = ordinal == str(index) and _tracked(status, pod)
            if ours and pod["status"].get("phase") == "Running":
                return pod
        return None

    return wait_for(find, timeout=STEP_TIMEOUT, interval=POLL, message=f"{name}: a running {role} {index}")


def _exit(api: client.ApiClient, ns: str, pod: Obj, exit_code: int) -> None:
    """The pod's containers exit with `exit_code`: this pod only, however often the call is retried."""
    meta = pod["metadata"]

    def inject() -> None:
        try:
            chaos.annotate_exit(api, ns, meta["name"], exit_code, uid=meta["uid"])
        except ApiException as error:
            if error.status not in (404, 422):  # gone or replaced: an earlier try landed
                raise

    _retry(inject, f"exit {exit_code} of pod {meta['name']}")


def _restarted(api: client.ApiClient, ns: str, name: str, role: str, index: int) -> None:
    _exit(api, ns, _running_pod(api, ns, name, role, index), RETRYABLE_EXIT)
    _status_until(api, ns, name, lambda s: (s.get("restarts") or 0) >= 1, "a restart")
    _running(api, ns, name)


def _worker_fails(api: client.ApiClient, ns: str, name: str) -> None:
    _exit(api, ns, _running_pod(api, ns, name, "worker", 1), RETRYABLE_EXIT)
    _status_until(
        api,
        ns,
        name,
        lambda s: (s.get("replicaStatuses") or {}).get("worker", {}).get("restarts", 0) >= 1,
        "the worker's failure recorded",
    )


def _suspend_and_resume(api: client.ApiClient, ns: str, name: str) -> None:
    _retry(lambda: psjobs.patch_spec(api, ns, name, {"runPolicy": {"suspend": True}}), f"suspend {name}")
    _status_until(api, ns, name, lambda s: s.get("phase") == "Suspended", "Suspended")
    _retry(lambda: psjobs.patch_spec(api, ns, name, {"runPolicy": {"suspend": False}}), f"resume {name}")
    _running(api, ns, name)


def _delete(api: client.ApiClient, ns: str, name: str) -> None:
    def delete() -> None:
        try:
            client.CustomObjectsApi(api).delete_namespaced_custom_object(
                psjobs.GROUP, psjobs.VERSION, ns, psjobs.PLURAL, name
            )
        except ApiException as error:
            if error.status != 404:
                raise

    _retry(delete, f"delete {name}")
    wait_for(lambda: psjobs.get(api, ns, name) is None, timeout=STEP_TIMEOUT, message=f"{name} gone")


def _finish(api: client.ApiClient, ns: str, name: str, kind: Kind) -> None:
    """The chief's last exit and the terminal phase it leads to."""
    phase, _ = EXPECTED[kind]
    exit_code = PERMANENT_EXIT if kind is Kind.PERMANENT else 0
    _exit(api, ns, _running_pod(api, ns, name, "chief"), exit_code)
    _status_until(api, ns, name, lambda s: s.get("phase") == phase, str(phase))


# Workers without GPUs: the simulated cluster has 8, and a run keeps many jobs going at once.
CPU_WORKERS = {"template": {"spec": {"containers": [{"name": "trainer"}]}}}


def _create(api: client.ApiClient, ns: str, name: str) -> None:
    def create() -> None:
        try:
            psjobs.create(api, ns, psjobs.manifest(name, worker=CPU_WORKERS))
        except ApiException as error:
            if error.status != 409:  # exists: an earlier try landed
                raise

    _retry(create, f"create {name}")


def drive(api: client.ApiClient, ns: str, name: str, kind: Kind) -> Outcome:
    """Takes the job through its scenario; the outcome holds the first error, if any."""
    started = time.monotonic()
    outcome = Outcome(name, kind)
    try:
        _create(api, ns, name)
        _running(api, ns, name)
        if kind is Kind.DELETE:
            _delete(api, ns, name)
        else:
            if kind in (Kind.PS, Kind.CHIEF):
                _restarted(api, ns, name, kind.value, 0)
            elif kind is Kind.WORKER:
                _worker_fails(api, ns, name)
            elif kind is Kind.SUSPEND:
                _suspend_and_resume(api, ns, name)
            _finish(api, ns, name, kind)
    except Exception as error:
        outcome.error = f"{type(error).__name__}: {error}"
    outcome.seconds = time.monotonic() - started
    return outcome


# --- what is checked at the end -------------------------------------------------------------


def wrong_endings(api: client.ApiClient, ns: str, outcomes: list[Outcome]) -> list[str]:
    """Each job against its scenario: its terminal phase (or gone) and its restarts."""
    wrong = []
    for o in outcomes:
        phase, restarts = EXPECTED[o.kind]
        job = psjobs.get(api, ns, o.name)
        status = (job or {}).get("status") or {}
        found = (status.get("phase"), status.get("restarts") or 0) if job else (None, 0)
        if found != (phase, restarts):
            wrong.append(
                f"{o.name} ({o.kind}): phase, restarts {found}, expected {(phase, restarts)}; "
                f"lastFailure {status.get('lastFailure')}; events: {psjobs.told(api, ns, o.name)}"
            )
    return wrong


def _children(api: client.ApiClient, ns: str) -> list[Obj]:
    """Everything in the namespace labelled for a job, as JSON with its kind."""
    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    lists: dict[str, Callable[..., Any]] = {
        "Service": core.list_namespaced_service,
        "ConfigMap": core.list_namespaced_config_map,
        "Pod": core.list_namespaced_pod,
        "StatefulSet": apps.list_namespaced_stateful_set,
        "Job": batch.list_namespaced_job,
    }
    return [
        {**as_json(api, item), "kind": kind}
        for kind, list_kind in lists.items()
        for item in list_kind(ns, label_selector=psjobs.LABEL_JOB).items
    ]


def orphans(api: client.ApiClient, ns: str) -> list[str]:
    """Children labelled for a job that no longer exists (or for an earlier job of that name)."""
    listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, ns, psjobs.PLURAL
    )
    uids = {j["metadata"]["name"]: j["metadata"]["uid"] for j in listed["items"]}  # type: ignore[index]
    found = []
    for child in _children(api, ns):
        meta = child["metadata"]
        job = meta["labels"][psjobs.LABEL_JOB]
        owners = {r["uid"] for r in meta.get("ownerReferences") or []}
        # Pods belong to their StatefulSet or Job, which belong to the job.
        if job not in uids or (child["kind"] != "Pod" and uids[job] not in owners):
            found.append(f"{child['kind']}/{meta['name']} of {job}")
    return found


# --- sampled during the run -----------------------------------------------------------------


@dataclass
class Sampler:
    """Every `interval` seconds: the resident memory of each operator process `processes()` names,
    the replicas' Lease as `lease()` reads it (its handovers; none without leader election), the
    chief pods Running per job (by who made them) and the chief Jobs per attempt."""

    api: client.ApiClient
    namespace: str
    processes: Callable[[], dict[str, int | None]]  # operator process (e.g. "b3", a start) -> pid
    lease: Callable[[], LeaseRecord | None] | None = None
    interval: float = 0.5
    handovers: Handovers = field(default_factory=Handovers)
    two_chiefs: list[str] = field(default_factory=list)
    # Two Running pods of one chief Job (job, attempt, the Job's uid) -> when seen: the Job
    # controller's own, when the response to its create is lost to an API server restart.
    twins: dict[tuple[str, str, str], list[float]] = field(
        default_factory=lambda: collections.defaultdict(list)
    )
    chief_jobs: dict[tuple[str, str], set[str]] = field(default_factory=lambda: collections.defaultdict(set))
    rss: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        for process, pid in self.processes().items():
            mib = rss_mib(pid) if pid else None
            if mib is not None:
                self.rss[process].append(mib)
        if self.lease:
            self.handovers.observe(self.lease())
        selector = f"{psjobs.LABEL_ROLE}=chief"
        pods = client.CoreV1Api(self.api).list_namespaced_pod(self.namespace, label_selector=selector)
        running = collections.defaultdict(list)
        for pod in map(self._json, pods.items):
            if pod["status"].get("phase") == "Running":
                running[pod["metadata"]["labels"][psjobs.LABEL_JOB]].append(pod)
        for job, chiefs in running.items():
            makers = {_maker(pod) for pod in chiefs}
            if len(makers) > 1:
                self.two_chiefs.append(f"{job}: {[_described(pod) for pod in chiefs]}")
            elif len(chiefs) > 1:
                ((attempt, owner),) = makers
                self.twins[(job, attempt, owner)].append(time.monotonic())
        jobs = client.BatchV1Api(self.api).list_namespaced_job(self.namespace, label_selector=selector)
        for meta in (self._json(j)["metadata"] for j in jobs.items):
            labels = meta["labels"]
            self.chief_jobs[(labels[psjobs.LABEL_JOB], labels[psjobs.LABEL_ATTEMPT])].add(meta["uid"])
        self.samples += 1

    def _json(self, obj: object) -> Obj:
        return as_json(self.api, obj)

    def run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # the API server restarting: the next sample will see
                continue

    def stop(self) -> None:
        self._stop.set()

    def duplicate_chief_jobs(self, outcomes: list[Outcome]) -> list[str]:
        """Chief Jobs made twice for one attempt; a suspended job has two of its attempt 0 (the
        suspension deletes the Job, the resume makes a new one), no more."""
        suspended = {o.name for o in outcomes if o.kind is Kind.SUSPEND}
        return [
            f"{job} attempt {attempt}: {len(u)} Jobs"
            for (job, attempt), u in self.chief_jobs.items()
            if len(u) > (2 if job in suspended and attempt == "0" else 1)
        ]

    def twins_seconds(self) -> dict[str, float]:
        """How long each chief Job's twin pods were seen Running together (first to last sample)."""
        return {f"{job} attempt {attempt}": max(t) - min(t) for (job, attempt, _), t in self.twins.items()}

    def peaks_mib(self) -> list[float]:
        """The highest resident memory of each operator process."""
        return [max(series) for series in self.rss.values()]


def _maker(pod: Obj) -> tuple[str, str]:
    """Who made a chief pod: its attempt and the uid of the Job that controls it."""
    meta = pod["metadata"]
    owner = next((r["uid"] for r in meta.get("ownerReferences") or [] if r.get("controller")), "")
    return str(meta["labels"].get(psjobs.LABEL_ATTEMPT)), str(owner)


def _described(pod: Obj) -> str:
    """A chief pod as the two-chief check reports it: enough to tell which attempt made it and when."""
    meta = pod["metadata"]
    deleting = f", deleting since {meta['deletionTimestamp']}" if meta.get("deletionTimestamp") else ""
    attempt = meta["labels"].get(psjobs.LABEL_ATTEMPT)
    return f"{meta['name']} (attempt {attempt}, created {meta.get('creationTimestamp')}{deleting})"


def injected(outcomes: list[Outcome]) -> dict[str, int]:
    """Failures injected by kind (only jobs whose scenario ran without error)."""
    kinds = collections.Counter(o.kind for o in outcomes if o.error is None)
    return {
        "ps": kinds[Kind.PS],
        "worker": kinds[Kind.WORKER],
        "chief (retryable)": kinds[Kind.CHIEF],
        "chief (permanent)": kinds[Kind.PERMANENT],
        "suspended+resumed": kinds[Kind.SUSPEND],
        "deleted mid-run": kinds[Kind.DELETE],
    }


def table(rows: list[tuple[str, object]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

"""The kopf layer: thin, level-based, and readable top to bottom.

One loop per PSTrainingJob runs reconciles: on start (including after an operator restart), when
the job or any of its children changes, and on a timer for progress, deadlines and TTLs. Each
reconcile reads the job and its children fresh from the API, lets `plan_reconcile` decide, writes
the status once, then applies the children and emits the events.

The loops are the operator's own tasks, started and stopped by the job's watch events, not kopf
daemons: kopf puts a finalizer on every object that has a daemon, and a job with a finalizer cannot
be deleted while the operator is stopped (its namespace then stays Terminating). Nothing needs one:
the children go with the job through their owner references, and the loop forgets the job when
the watch says it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf

from psoperator import GROUP, PLURAL, VERSION
from psoperator.contract import DEFAULT_PROGRESS_PORT, ProgressReport
from psoperator.faults import Fault, crash_at
from psoperator.kube import Kube, StaleJob, api_failure, fetch_progress, in_thread, merge_patch, owned_by
from psoperator.leader import Election, Elector
from psoperator.metrics import Metrics
from psoperator.observe import NodeView, Observed, PodView, build_observed, owned_pods, parse_node, parse_pod
from psoperator.policies import node_lost
from psoperator.policies.recovery import unexplained
from psoperator.readings import read_job
from psoperator.reconcile import ReconcilePlan, plan_reconcile
from psoperator.render import render_children
from psoperator.render.names import LABEL_JOB

Obj = dict[str, Any]
log = logging.getLogger(__name__)
DEPARTED_LIMIT = 4096
UNEXPLAINED_RETRIES, UNEXPLAINED_WAIT = 6, 0.5
# After a failed reconcile: the first retry soon, then less and less often.
RETRY_FIRST, RETRY_MAX = 1.0, 30.0


@dataclass
class OperatorState:
    """Shared across handlers through kopf's memo (never module globals)."""

    kube: Kube
    metrics: Metrics
    cluster_domain: str = "cluster.local"
    operator_namespace: str | None = None  # the only one that may read the chiefs' progress port
    resync_seconds: float = 10.0
    progress_port: int = DEFAULT_PROGRESS_PORT
    faults: frozenset[Fault] = frozenset()  # test hooks (faults.py); none in production
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    loops: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)
    session: aiohttp.ClientSession | None = None
    # Node name -> its Ready condition, from kopf's node index (a watch, no reads per reconcile);
    # None until kopf hands the index over: an empty index would make every node look deleted.
    nodes: Mapping[str, Any] | None = None
    # Last state of pods that ended, as the watch showed it (uid -> view), newest last.
    departed: OrderedDict[str, PodView] = field(default_factory=OrderedDict)
    # With leader election (several replicas), only the Lease's holder runs the jobs' loops; the
    # others keep the jobs the watch shows, to start their loops when they take over.
    election: Election | None = None
    elector: Elector | None = None
    election_task: asyncio.Task[None] | None = None
    known: set[tuple[str, str]] = field(default_factory=set)

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading

    def remember_departed(self, view: PodView) -> None:
        self.departed[view.uid] = view
        self.departed.move_to_end(view.uid)
        while len(self.departed) > DEPARTED_LIMIT:
            self.departed.popitem(last=False)


def _state(memo: Any) -> OperatorState:
    state = memo.state
    assert isinstance(state, OperatorState)
    return state


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # No handler needs a finalizer; kopf removes this one (put on jobs by versions that ran kopf
    # daemons) from every job it sees, so upgraded clusters are not left with undeletable jobs.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key="last-handled")
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = _state(memo).kube.timeout
    state = _state(memo)
    state.session = aiohttp.ClientSession()
    state.metrics.leader.set(1 if state.election is None else 0)
    if state.election is not None:
        state.elector = Elector(
            state.kube, state.election, lead=lambda: _lead(state), follow=lambda: _follow(state)
        )
        state.election_task = asyncio.create_task(state.elector.run(), name="leader-election")


async def _lead(state: OperatorState) -> None:
    """This replica took the Lease: every job it knows gets its loop (a restart was perhaps half done)."""
    state.metrics.leader.set(1)
    for key in sorted(state.known):
        _start_loop(state, key, log)


async def _follow(state: OperatorState) -> None:
    """Another replica holds the Lease: no loop of ours may act any more."""
    state.metrics.leader.set(0)
    for key in list(state.loops):
        await _stop_loop(state, key)


@kopf.on.cleanup()
async def close(memo: Any, **_: Any) -> None:
    state = _state(memo)
    if state.election_task is not None:
        state.election_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await state.election_task
    for key in list(state.loops):
        await _stop_loop(state, key)
    if state.elector is not None:
        await state.elector.release()
    session = state.session
    if session is not None:
        await session.close()


@kopf.on.probe(id="jobs")
def probe_jobs(memo: Any, **_: Any) -> int:
    return len(_state(memo).wakeups)


def _wake(memo: Any, namespace: str | None, job_name: str | None) -> None:
    if namespace and job_name:
        event = _state(memo).wakeups.get((namespace, job_name))
        if event is not None:
            event.set()


@kopf.index("nodes", id="node_health")
def node_health(name: str, body: kopf.Body, **_: Any) -> dict[str, NodeView]:
    """Each node's Ready condition. kopf fills every index before it handles any job, so a node
    missing from it is a node that does not exist."""
    return {name: parse_node(dict(body))}


@kopf.on.event(GROUP, VERSION, PLURAL, id="job-changed")
async def job_changed(
    type: str | None,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: Any,
    logger: Any,
    node_health: kopf.Index[str, NodeView] | None = None,  # kopf passes every index by its id
    **_: Any,
) -> None:
    """Every job has a reconcile loop while it exists and is not being deleted (listing included)."""
    state = _state(memo)
    if node_health is not None:
        state.nodes = node_health
    if namespace is None:  # PSTrainingJob is namespaced; kopf types allow None for cluster objects
        return
    key = (namespace, name)
    if type == "DELETED" or body.metadata.get("deletionTimestamp"):
        state.known.discard(key)
        await _stop_loop(state, key)
        return
    state.known.add(key)
    if state.leading:
        _start_loop(state, key, logger)
        _wake(memo, namespace, name)


def _start_loop(state: OperatorState, key: tuple[str, str], logger: Any) -> None:
    if key not in state.loops:
        state.wakeups[key] = asyncio.Event()
        state.loops[key] = asyncio.create_task(run_job(state, *key, logger), name="/".join(key))


async def _stop_loop(state: OperatorState, key: tuple[str, str]) -> None:
    """Cancel the job's loop and wait for it: its clean-up (wake-up, metrics) runs before this returns."""
    loop = state.loops.get(key)
    if loop is not None:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        # A loop cancelled before it ever ran did not clean up after itself.
        _drop_loop(state, key, loop)


def _drop_loop(state: OperatorState, key: tuple[str, str], loop: asyncio.Task[None] | None) -> None:
    """The job's loop is over: it is forgotten (unless a newer one took its place), and its series."""
    if state.loops.get(key) is loop:
        state.loops.pop(key)
        state.wakeups.pop(key, None)
    state.metrics.forget(*key)  # a deleted job leaves no series behind
    state.metrics.jobs_managed.set(len(state.loops))


@kopf.on.event("pods", labels={LABEL_JOB: kopf.PRESENT}, id="pod-changed")
def pod_changed(
    type: str,
    body: kopf.Body,
    namespace: str | None,
    labels: Mapping[str, str],
    memo: Any,
    logger: Any,
    **_: Any,
) -> None:
    view = parse_pod(dict(body))
    if type == "DELETED" or view.deleting or view.phase in ("Failed", "Succeeded"):
        _state(memo).remember_departed(view)
        logger.debug("pod %s (%s) ended: %s %s", view.name, view.uid, view.phase, view.disruption)
    _wake(memo, namespace, labels.get(LABEL_JOB))


@kopf.on.event("apps", "v1", "statefulsets", labels={LABEL_JOB: kopf.PRESENT}, id="statefulset-changed")
@kopf.on.event("batch", "v1", "jobs", labels={LABEL_JOB: kopf.PRESENT}, id="job-child-changed")
@kopf.on.event("services", labels={LABEL_JOB: kopf.PRESENT}, id="service-changed")
def child_changed(namespace: str | None, labels: Mapping[str, str], memo: Any, **_: Any) -> None:
    _wake(memo, namespace, labels.get(LABEL_JOB))


async def _progress(state: OperatorState, observed: Observed, attempt: int) -> ProgressReport | None:
    chief = observed.chief_pod(attempt)
    if chief is None:
        return None
    if chief.terminated is not None:  # the runtime's last word, as its termination message
        return ProgressReport.parse(chief.terminated.message)
    if chief.running and chief.ip and state.session is not None:
        return await fetch_progress(state.session, chief.ip, state.progress_port)
    return None


def _with_nodes(state: OperatorState, observed: Observed) -> Observed:
    """The nodes of the job's pods, for the node-lost policy, from the node index."""
    index = state.nodes
    names = node_lost.nodes_of(observed)
    if index is None or not names:
        return observed
    return replace(observed, nodes={n: next(iter(index[n]), None) if n in index else None for n in names})


async def reconcile_once(
    state: OperatorState, namespace: str, name: str, logger: Any
) -> ReconcilePlan | None:
    job = await in_thread(state.kube.get_job, namespace, name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return None
    children, pods = await asyncio.gather(
        in_thread(state.kube.list_children, namespace, name), in_thread(state.kube.list_pods, namespace, name)
    )
    uid = job["metadata"]["uid"]
    ours = [c for c in children if owned_by(c, uid)]
    tracking = ((job.get("status") or {}).get("tracking") or {}).get("pods") or {}
    owners = {c["metadata"]["uid"] for c in ours}

    def observe(listed: list[Obj]) -> Observed:
        return build_observed(ours, owned_pods(listed, owners, name), name, dict(state.departed))

    observed = observe(pods)
    # A pod replaced between two reconciles: its last state may still be on its way through the watch.
    # Wait for it a little, so the failure is classified by what happened instead of "Replaced".
    for _ in range(UNEXPLAINED_RETRIES):
        if not unexplained(tracking, observed.pods, observed.departed):
            break
        await asyncio.sleep(UNEXPLAINED_WAIT)
        observed = observe(await in_thread(state.kube.list_pods, namespace, name))
    observed = _with_nodes(state, observed)
    attempt = int((job.get("status") or {}).get("restarts") or 0)
    report = await _progress(state, observed, attempt)
    now = datetime.now(UTC)
    plan = plan_reconcile(
        job,
        observed,
        report,
        now,
        cluster_domain=state.cluster_domain,
        operator_namespace=state.operator_namespace,
    )

    patch = merge_patch(job.get("status") or {}, plan.status)
    if patch:
        version = job["metadata"]["resourceVersion"]
        await in_thread(state.kube.patch_job_status, namespace, name, patch, version)
    state.metrics.record(namespace, name, read_job(job, plan, now))
    if plan.restarted:
        crash_at(Fault.EXIT_AFTER_RESTART_STATUS_WRITE, state.faults)
    if plan.delete_job:
        kopf.info(job, reason="Expired", message="ttlSecondsAfterFinished passed: deleting the job")
        await in_thread(state.kube.delete_job, namespace, name, uid)
        return plan
    if plan.delete_pods:
        await in_thread(state.kube.delete_pods, namespace, plan.delete_pods)
    if plan.render is not None:
        desired = render_children(job, plan.render)
        result = await in_thread(
            state.kube.apply_children,
            namespace,
            uid,
            desired,
            children,
            create_missing=plan.create_missing,
            hold_chief=plan.hold_chief,
        )
        for ref in result.conflicts:
            kopf.warn(
                job, reason="NameConflict", message=f"{ref} exists and is not owned by this job; left alone"
            )
        for ref in result.rejected:
            kopf.warn(job, reason="ChildRejected", message=ref)
        if result.created or result.deleted:
            logger.info("created %s, deleted %s", result.created, result.deleted)
    for event in plan.events:
        kopf.event(job, type=event.type, reason=event.reason, message=event.message)
    return plan


def retry_after(failures: int) -> float:
    """Seconds before the next reconcile after `failures` failed ones in a row (exponential back-off)."""
    return float(min(RETRY_FIRST * 2 ** (failures - 1), RETRY_MAX))


def log_failure(logger: Any, error: Exception, failures: int) -> None:
    """Only the first failure of a series is logged: a failed API request in one line, anything else
    with its traceback; the rest of the series at debug level, so an API outage is no log storm."""
    if failures > 1:
        logger.debug("reconcile failed again (%d in a row): %s", failures, api_failure(error) or error)
        return
    summary = api_failure(error)
    if summary is None:
        logger.exception("reconcile failed; retrying with back-off")
    else:
        logger.warning("reconcile failed: %s; retrying with back-off", summary)


async def run_job(state: OperatorState, namespace: str, name: str, logger: Any) -> None:
    """Reconcile the job until it is gone or its loop is cancelled (deleted job, operator stopping)."""
    key = (namespace, name)
    wake = state.wakeups.setdefault(key, asyncio.Event())
    state.metrics.jobs_managed.set(len(state.loops))
    failures = 0
    try:
        while True:
            wake.clear()
            wait = state.resync_seconds
            started = time.monotonic()
            try:
                plan = await reconcile_once(state, namespace, name, logger)
                state.metrics.reconciled("ok", time.monotonic() - started)
            except StaleJob as stale:  # another writer got there first: read it again at once
                logger.info("%s; reconciling it again", stale)
                plan, wait = None, 0.0
            except Exception as error:  # one bad reconcile must not end the job's loop
                failures += 1
                log_failure(logger, error, failures)
                state.metrics.reconciled("error", time.monotonic() - started)
                plan, wait = None, retry_after(failures)
            else:
                if failures:
                    logger.info("reconcile succeeded again after %d failures", failures)
                failures = 0
                if plan is None:  # gone or being deleted, even if its watch event is still to come
                    return
            if plan is not None and plan.requeue_after is not None:
                wait = min(wait, max(plan.requeue_after, 0.5))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=wait)
            # Let a burst of child events settle into one reconcile.
            await asyncio.sleep(0.2)
    finally:
        _drop_loop(state, key, asyncio.current_task())

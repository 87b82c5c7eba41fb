"""The kopf layer: thin, level-based, and readable top to bottom.

One loop per PSTrainingJob runs reconciles: on start (including after an operator restart), when
the job's spec or any of its children changes (not when its status does: the operator writes it),
and on a timer for progress, deadlines and TTLs (finished and suspended jobs rarely, every timer
jittered). Each reconcile decides from what the watches delivered (cache.py); one that is about to
act reads the job and its children fresh from the API and decides again. `plan_reconcile` decides,
then the status is written once, the children applied and the events emitted.

The loops are the operator's own tasks, started and stopped by the job's watch events, not kopf
daemons: kopf puts a finalizer on every object that has a daemon, and a job with a finalizer cannot
be deleted while the operator is stopped (its namespace then stays Terminating). Nothing needs one:
the children go with the job through their owner references, and the loop forgets the job when
the watch says it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import random
import time
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf

from psoperator import GROUP, PLURAL, VERSION, polling
from psoperator.api.labels import CHILD_KINDS, LABEL_JOB
from psoperator.api.models import Tracking
from psoperator.api.vocabulary import FINISHED_PHASES, Phase
from psoperator.contract import DEFAULT_PROGRESS_PORT, ProgressReport
from psoperator.faults import Fault, crash_at
from psoperator.kube import (
    API_CONCURRENCY,
    LIST_PAGE,
    Kube,
    NotServing,
    StaleJob,
    api_failure,
    fetch_progress,
    in_thread,
)
from psoperator.leader import Election, Elector
from psoperator.metrics.readings import read_job
from psoperator.metrics.registry import Metrics
from psoperator.observe.cache import JobKey, Snapshot, WatchCache
from psoperator.observe.failures import unexplained
from psoperator.observe.views import (
    NodeView,
    Observed,
    PodView,
    build_observed,
    owned_by,
    owned_pods,
    parse_node,
    parse_pod,
)
from psoperator.plan.children import ChildChange, children_fingerprint, plan_children
from psoperator.plan.stages import ReconcilePlan, plan_reconcile
from psoperator.policies import node_lost
from psoperator.render import render_children
from psoperator.status.patch import merge_patch

Obj = dict[str, Any]
DEPARTED_LIMIT = 4096
UNEXPLAINED_RETRIES, UNEXPLAINED_WAIT = 6, 0.5
# After a failed reconcile: the first retry soon, then less and less often.
RETRY_FIRST, RETRY_MAX = 1.0, 30.0
# The children's watches (kopf resource selectors), each filtered by the API server to the objects
# that carry the job label (settings.watching.label_selectors): other pods never reach the operator.
PODS = ("v1", "pods")
CHILDREN = (
    ("v1", "services"),
    ("apps", "v1", "statefulsets"),
    ("batch", "v1", "jobs"),
    ("v1", "configmaps"),
    ("networking.k8s.io", "v1", "networkpolicies"),
)
# Timers are spread by this fraction either way, so jobs started together do not stay aligned.
JITTER = 0.1
# A woken loop waits this long for the rest of a burst of events of the job's objects.
SETTLE_SECONDS = 0.05
# A status change that needs nothing else (pods coming up one by one, the step) is written at most
# this often; anything that acts (a restart, a child, an event) or a parameter server's tracking
# (ReconcilePlan.write_now) writes at once.
STATUS_SPACING_SECONDS = 5.0
# How often a starting operator asks whether its CRD is served yet.
CRD_POLL_SECONDS = 2.0


@dataclass
class OperatorState:
    """Shared across handlers through kopf's memo (never module globals)."""

    kube: Kube
    metrics: Metrics
    cluster_domain: str = "cluster.local"
    operator_namespace: str | None = None  # the only one that may read the chiefs' progress port
    resync_seconds: float = 10.0
    # The unwoken reconciles of all jobs together, at most, on average: when the jobs' resyncs would
    # come more often, every resync stretches by the same factor (1,000 running jobs at 20: every
    # 50 s; 100 running and 900 finished ones: still every 10 s, the finished ones costing 3 a
    # second). Events still wake a job at once; a plan's own timer (a TTL, a deadline) still comes
    # on time.
    resyncs_per_second: float = 20.0
    # Finished and suspended jobs: only their TTL and a resume need them, and both wake them.
    idle_resync_seconds: float = 300.0
    # The jobs whose last reconcile found them finished or suspended.
    idle: set[JobKey] = field(default_factory=set)
    # The longest a job goes without a fresh read of its children (see cache.py).
    fresh_read_seconds: float = 600.0
    progress_port: int = DEFAULT_PROGRESS_PORT
    faults: frozenset[Fault] = frozenset()  # test hooks (faults.py); none in production
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    loops: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)
    session: aiohttp.ClientSession | None = None
    cache: WatchCache = field(default_factory=WatchCache)
    # Node name -> its Ready condition, from kopf's node index (a watch, no reads per reconcile);
    # None until kopf hands the index over: an empty index would make every node look deleted.
    nodes: Mapping[str, Any] | None = None
    # Last state of pods that ended, as the watch showed it (uid -> view), newest last.
    departed: OrderedDict[str, PodView] = field(default_factory=OrderedDict)
    # With leader election (several replicas), only the Lease's holder runs the jobs' loops; the
    # others keep the jobs the watch shows (with each one's logger), to start their loops when they
    # take over.
    election: Election | None = None
    elector: Elector | None = None
    election_task: asyncio.Task[None] | None = None
    known: dict[tuple[str, str], Any] = field(default_factory=dict)
    # The context every loop runs in: a copy of the first job handler's, where kopf keeps its event
    # posting (the operator's one queue; a loop without it fails at its first event). Not each job
    # handler's own: that holds the event's whole job for as long as the loop runs.
    context: contextvars.Context | None = None
    # Job uid -> the inputs with which its children were last found as rendered (_sync_inputs).
    in_sync: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # Job uid -> its chief's refusals of the progress port in a row (polling.py).
    refusals: dict[str, polling.Refusals] = field(default_factory=dict)

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
    # kopf lists each watched kind before it watches, and hands every listed object to a worker of
    # its own that keeps the object whole until it has handled it. Listed all at once, a restart
    # with 1,000 jobs held every pod, child and job whole at the same time: RSS peaked at 620-640
    # MiB and stayed near 590 (the chart's limit is 512 MiB). Listed a page at a time, the next page
    # comes only after the handlers had a turn: the same restart peaks at 290-345 MiB (README).
    settings.watching.chunk_size = LIST_PAGE
    settings.networking.request_timeout = _state(memo).kube.timeout
    for resource in (PODS, *CHILDREN):
        settings.watching.label_selectors[resource] = LABEL_JOB
    state = _state(memo)
    state.session = aiohttp.ClientSession()
    # The API calls' threads (kube.in_thread); kopf runs its sync handlers in an executor of its own.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(API_CONCURRENCY, thread_name_prefix="kube")
    )
    state.metrics.leader.set(1 if state.election is None else 0)
    if state.election is not None:
        state.elector = Elector(
            state.kube, state.election, lead=lambda: _lead(state), follow=lambda: _follow(state)
        )
        state.election_task = asyncio.create_task(state.elector.run(), name="leader-election")


@kopf.on.startup(id="crd-served")
async def wait_for_the_crd(memo: Any, logger: Any, **_: Any) -> None:
    """Start only once the API server serves pstrainingjobs. kopf resolves the resources it serves
    when it starts and again at each event of a CRD, but the API server may publish a new CRD in its
    discovery after the CRD's last event: an operator started before its CRD (applied later, or in
    the same `kubectl apply`) would never serve a job. kopf starts watching after its startup
    handlers, so from here on it finds the CRD."""
    state = _state(memo)
    told = False
    while PLURAL not in await in_thread(state.kube.served, GROUP, VERSION):
        if not told:
            logger.warning(f"waiting for the API server to serve {PLURAL}.{GROUP}/{VERSION}: apply crds/")
            told = True
        await asyncio.sleep(CRD_POLL_SECONDS)
    if told:
        logger.warning(f"{PLURAL}.{GROUP}/{VERSION} is served: starting")


async def _lead(state: OperatorState) -> None:
    """This replica took the Lease: every job it knows gets its loop (a restart was perhaps half done)."""
    state.metrics.leader.set(1)
    for key in sorted(state.known):
        _start_loop(state, key, state.known[key])


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


def _wake(state: OperatorState, key: JobKey | None) -> None:
    """Wake the job's loop. Only from the event loop's thread: asyncio.Event is not thread-safe, so
    every handler that wakes is async (kopf runs sync handlers in executor threads)."""
    event = state.wakeups.get(key) if key is not None else None
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
        state.known.pop(key, None)
        await _stop_loop(state, key)
        state.cache.forget(key)
        uid = str(body.metadata.get("uid"))
        state.in_sync.pop(uid, None)
        state.refusals.pop(uid, None)
        return
    changed = state.cache.job_seen(namespace, name, dict(body))
    state.known[key] = logger
    if state.context is None:
        state.context = contextvars.copy_context()
    if state.leading:
        started = _start_loop(state, key, logger)
        if changed and not started:
            _wake(state, key)


def _start_loop(state: OperatorState, key: tuple[str, str], logger: Any) -> bool:
    """Start the job's loop (in a copy of `state.context`) unless it runs; True when this started it."""
    if key in state.loops:
        return False
    state.wakeups[key] = asyncio.Event()
    loop = run_job(state, *key, logger)
    context = state.context.copy() if state.context is not None else None
    state.loops[key] = asyncio.create_task(loop, name="/".join(key), context=context)
    return True


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
        state.idle.discard(key)
    state.metrics.forget(*key)  # a deleted job leaves no series behind
    state.metrics.jobs_managed.set(len(state.loops))


@kopf.on.event(*PODS, labels={LABEL_JOB: kopf.PRESENT}, id="pod-changed")
async def pod_changed(type: str, body: kopf.Body, memo: Any, logger: Any, **_: Any) -> None:
    state = _state(memo)
    view = parse_pod(dict(body))
    if type == "DELETED" or view.deleting or view.phase in ("Failed", "Succeeded"):
        state.remember_departed(view)
        logger.debug("pod %s (%s) ended: %s %s", view.name, view.uid, view.phase, view.disruption)
    _wake(state, state.cache.pod_seen(type, dict(body), view))


@kopf.on.event(*CHILDREN[0], labels={LABEL_JOB: kopf.PRESENT}, id="service-changed")
@kopf.on.event(*CHILDREN[1], labels={LABEL_JOB: kopf.PRESENT}, id="statefulset-changed")
@kopf.on.event(*CHILDREN[2], labels={LABEL_JOB: kopf.PRESENT}, id="job-child-changed")
@kopf.on.event(*CHILDREN[3], labels={LABEL_JOB: kopf.PRESENT}, id="configmap-changed")
@kopf.on.event(*CHILDREN[4], labels={LABEL_JOB: kopf.PRESENT}, id="networkpolicy-changed")
async def child_changed(type: str, body: kopf.Body, memo: Any, **_: Any) -> None:
    state = _state(memo)
    _wake(state, state.cache.child_seen(type, dict(body)))


async def _progress(
    state: OperatorState, uid: str, observed: Observed, attempt: int
) -> ProgressReport | None:
    """The chief's report: its termination message once it ended, else from its progress port
    unless the port refused lately (polling.py)."""
    chief = observed.chief_pod(attempt)
    if chief is None:
        return None
    if chief.terminated is not None:  # the runtime's last word, as its termination message
        return ProgressReport.parse(chief.terminated.message)
    if not (chief.running and chief.ip and state.session is not None):
        return None
    now = time.monotonic()
    if not polling.due(state.refusals.get(uid), chief.uid, now):
        return None
    try:
        report = await fetch_progress(state.session, chief.ip, state.progress_port)
    except NotServing:
        state.refusals[uid] = polling.refused(state.refusals.get(uid), chief.uid, now)
        return None
    state.refusals.pop(uid, None)
    return report


def _with_nodes(state: OperatorState, observed: Observed) -> Observed:
    """The nodes of the job's pods, for the node-lost policy, from the node index."""
    index = state.nodes
    names = node_lost.nodes_of(observed)
    if index is None or not names:
        return observed
    return replace(observed, nodes={n: next(iter(index[n]), None) if n in index else None for n in names})


@dataclass(frozen=True)
class Decision:
    plan: ReconcilePlan
    report: ProgressReport | None
    changes: list[ChildChange]
    conflicts: list[str]  # children's names taken by objects the job does not own (plan_children)
    now: datetime

    @property
    def quiet(self) -> bool:
        """Nothing to do beyond a status write: no child to change, pod to delete, restart or event."""
        plan = self.plan
        acts = plan.restarted or plan.delete_job or plan.delete_pods or plan.events or plan.failures
        return not (acts or plan.write_now or self.changes or self.conflicts)


async def _read_fresh(state: OperatorState, key: JobKey) -> Snapshot | None:
    """The job, its children and its pods from the API (and into the cache); None once it is gone."""
    started = time.monotonic()
    job = await in_thread(state.kube.get_job, *key)
    if job is None:
        return None
    *listed, pods = await asyncio.gather(
        *(in_thread(state.kube.list_children, *key, kind) for kind in CHILD_KINDS),
        in_thread(state.kube.list_pods, *key, parse_pod),
    )
    children = [child for kind in listed for child in kind]
    state.cache.read_fresh(key, job, children, pods, started)
    return Snapshot(job, children, pods)


async def _observe(state: OperatorState, seen: Snapshot, fresh: bool) -> Observed:
    job = seen.job
    name, uid = job["metadata"]["name"], job["metadata"]["uid"]
    owners = {c["metadata"]["uid"] for c in seen.children if owned_by(c, uid)}
    ours = [c for c in seen.children if owned_by(c, uid)]
    tracking = Tracking.model_validate((job.get("status") or {}).get("tracking") or {}).pods

    def observe(listed: list[PodView]) -> Observed:
        return build_observed(ours, owned_pods(listed, owners, name), name, dict(state.departed))

    observed, key = observe(seen.pods), (job["metadata"]["namespace"], name)
    # A pod replaced between two reconciles: its last state may still be on its way through the watch.
    # Wait for it a little, so the failure is classified by what happened instead of "Replaced".
    for _ in range(UNEXPLAINED_RETRIES):
        if not unexplained(tracking, observed.pods, observed.departed):
            break
        await asyncio.sleep(UNEXPLAINED_WAIT)
        cached = state.cache.snapshot(key)
        pods = (
            await in_thread(state.kube.list_pods, *key, parse_pod) if fresh or cached is None else cached.pods
        )
        observed = observe(pods)
    return _with_nodes(state, observed)


def _sync_inputs(job: Obj, plan: ReconcilePlan, children: list[Obj]) -> tuple[Any, ...]:
    """All that decides which children to change: the job's version and the render options (the
    rendered children), the plan's flags and what plan_children reads of the observed children."""
    meta = job["metadata"]
    fingerprint = children_fingerprint(meta["uid"], children)
    return (meta["resourceVersion"], plan.render, plan.create_missing, plan.hold_chief, fingerprint)


async def _decide(
    state: OperatorState, seen: Snapshot, fresh: bool, report: ProgressReport | None = None
) -> Decision:
    job = seen.job
    observed = await _observe(state, seen, fresh)
    attempt = int((job.get("status") or {}).get("restarts") or 0)
    report = report or await _progress(state, job["metadata"]["uid"], observed, attempt)
    now = datetime.now(UTC)
    plan = plan_reconcile(
        job,
        observed,
        report,
        now,
        cluster_domain=state.cluster_domain,
        operator_namespace=state.operator_namespace,
    )
    if plan.render is None:
        return Decision(plan, report, [], [], now)
    uid, inputs = job["metadata"]["uid"], _sync_inputs(job, plan, seen.children)
    if state.in_sync.get(uid) == inputs:
        # The same as when its children were last found as rendered: a Running job's reconciles
        # render nothing (rendering is most of their CPU), and nothing rendered is kept per job.
        return Decision(plan, report, [], [], now)
    desired = render_children(job, plan.render)
    changes, conflicts = plan_children(
        uid, desired, seen.children, create_missing=plan.create_missing, hold_chief=plan.hold_chief
    )
    if not changes and not conflicts:
        state.in_sync[uid] = inputs
    return Decision(plan, report, changes, conflicts, now)


def never_acted_on(seen: Snapshot | None) -> bool:
    """A job with no status has no children of ours: every reconcile writes the status before it
    creates anything. Deciding on it needs no fresh read: its status write names the version it was
    decided on, and the API server refuses it (StaleJob) if another writer came first."""
    return seen is not None and not seen.job.get("status")


async def reconcile_once(
    state: OperatorState, namespace: str, name: str, logger: Any
) -> ReconcilePlan | None:
    """Decide from the cache; read fresh and decide again before acting, or when the job's last
    fresh read is older than `fresh_read_seconds` (or it has none: a new loop), unless the job was
    never acted on."""
    started = time.monotonic()
    key = (namespace, name)
    seen = state.cache.snapshot(key)
    new = never_acted_on(seen)  # decided and acted on from the watch alone
    due = seen is None or started - state.cache.read_at.get(key, -math.inf) >= state.fresh_read_seconds
    fresh = due and not new
    if fresh:
        seen = await _read_fresh(state, key)
    if seen is None or seen.job["metadata"].get("deletionTimestamp"):
        return None
    decision = await _decide(state, seen, fresh)
    since_write = started - state.cache.written_at.get(key, -math.inf)
    if decision.quiet and since_write < STATUS_SPACING_SECONDS:
        wait = STATUS_SPACING_SECONDS - since_write
        requeue = wait if decision.plan.requeue_after is None else min(wait, decision.plan.requeue_after)
        return replace(decision.plan, requeue_after=requeue)
    if not fresh and not new and not decision.quiet:
        seen = await _read_fresh(state, key)
        if seen is None or seen.job["metadata"].get("deletionTimestamp"):
            return None
        decision = await _decide(state, seen, True, decision.report)
    await _act(state, seen, decision, logger)
    return decision.plan


async def _act(state: OperatorState, seen: Snapshot, decision: Decision, logger: Any) -> None:
    """Write the status once, then carry out the plan, then emit its events."""
    job: Any = seen.job  # kopf's event functions take the raw object (typed as their Body)
    plan = decision.plan
    namespace, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]
    patch = merge_patch(job.get("status") or {}, plan.status)
    if patch:
        version = job["metadata"]["resourceVersion"]
        written = await in_thread(state.kube.patch_job_status, namespace, name, patch, version)
        state.cache.job_seen(namespace, name, written)
        state.cache.written_at[(namespace, name)] = time.monotonic()
    state.metrics.record(namespace, name, read_job(job, plan, decision.now))
    if plan.restarted:
        crash_at(Fault.EXIT_AFTER_RESTART_STATUS_WRITE, state.faults)
    if plan.delete_job:
        kopf.info(job, reason="Expired", message="ttlSecondsAfterFinished passed: deleting the job")
        await in_thread(state.kube.delete_job, namespace, name, uid)
        return
    # At once: a restart stops the old chief and every PS that served it (49 of them in a big job).
    await asyncio.gather(*(in_thread(state.kube.delete_pod, namespace, d) for d in plan.delete_pods))
    if decision.changes or decision.conflicts:
        result = await in_thread(state.kube.make_changes, namespace, decision.changes, decision.conflicts)
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


def is_idle(plan: ReconcilePlan | None) -> bool:
    return plan is not None and plan.status.get("phase") in (*FINISHED_PHASES, Phase.SUSPENDED)


def pace_stretch(state: OperatorState) -> float:
    """How much every resync stretches so that all jobs' together stay within resyncs_per_second."""
    idle = len(state.idle & state.loops.keys())
    running = len(state.loops) - idle
    wanted = running / state.resync_seconds + idle / state.idle_resync_seconds
    return max(1.0, wanted / state.resyncs_per_second)


def resync_after(state: OperatorState, plan: ReconcilePlan | None) -> float:
    """When to look at the job again unwoken: soon while it runs, rarely once it has finished or is
    suspended (both later when there are so many jobs that resyncs_per_second would be passed),
    sooner when the plan asks (a TTL, a deadline, an old chief stopping); jittered."""
    base = state.idle_resync_seconds if is_idle(plan) else state.resync_seconds
    wait = base * pace_stretch(state) * random.uniform(1 - JITTER, 1 + JITTER)
    if plan is not None and plan.requeue_after is not None:
        wait = min(wait, max(plan.requeue_after, 0.5))
    return wait


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
            started = time.monotonic()
            try:
                plan = await reconcile_once(state, namespace, name, logger)
                state.metrics.reconciled("ok", time.monotonic() - started)
                if is_idle(plan):
                    state.idle.add(key)
                else:
                    state.idle.discard(key)
                wait = resync_after(state, plan)
            except StaleJob as stale:  # another writer got there first: read it again at once
                logger.info("%s; reconciling it again", stale)
                plan, wait = None, 0.0
                state.cache.read_at.pop(key, None)  # from the API, not from the watch
            except Exception as error:  # one bad reconcile must not end the job's loop
                failures += 1
                log_failure(logger, error, failures)
                state.metrics.reconciled("error", time.monotonic() - started)
                plan, wait = None, retry_after(failures)
                state.cache.read_at.pop(key, None)  # the next one reads fresh
            else:
                if failures:
                    logger.info("reconcile succeeded again after %d failures", failures)
                failures = 0
                if plan is None:  # gone or being deleted, even if its watch event is still to come
                    return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=wait)
            await asyncio.sleep(SETTLE_SECONDS)
    finally:
        _drop_loop(state, key, asyncio.current_task())

"""One reconcile of one job: what it reads (the watch cache or the API), when it decides again, and
the order of its writes.

A reconcile decides from what the watches delivered (observe/cache.py). One that is about to act
(create, patch or delete a child, delete a pod, restart the chief, emit an event) reads the job, its
pods and its chief Jobs fresh from the API (ACT_READ: 3 requests; every kind of child is 7) and
decides again: the watch may lag the API server by a few events, and the restart counter and the
chief's attempt must be read where they were last written, or a restart could be made twice. The
other children come from the cache, which holds the operator's own writes as the API server answered
them. A job never acted on (no status: nothing of ours exists yet) is the exception: only its pods
are read (an earlier job's of its name may still be there, which the watch dropped with that job);
its status write names the version it was decided on, and the API server refuses it (StaleJob) if
another writer came first.

    reconcile_once
         |
         v
    cache snapshot ---- none; or the job has a status and no fresh read yet (a new loop), or its
         |              last is older than fresh_read_seconds (stretched past
         |              fresh_reads_per_second; a failed reconcile makes it due) and the
         |              last such periodic read went
         |              1 / fresh_reads_per_second ago ----------------> read fresh (in full)
         |                                                               |
         +-- its last status write was refused (409) ------------------> read fresh (ACT_READ)
         |                                                               |
         v                                                               v
      decide <-----------------------------------------------------------+
         |
         +-- from the cache, what it is decided from is as it was when its last decision
         |   changed nothing, and that decision's clock has not run out (control/decision_cache.py)
         |   --> that decision, as is
         |
         +-- only a status change, written less than STATUS_SPACING_SECONDS ago
         |   --> nothing written; look again when the spacing is over
         |
         +-- decided from the cache, acts (or has waited DEPARTURE_RECHECK_SECONDS since its
         |   last fresh read for pods to go), the job has a status
         |   --> read fresh (ACT_READ), decide again (with the progress report already read)
         v
       act: write the status once (with the resourceVersion it was computed from)
            -> post the plan's events -> change children and delete pods, all at once
               (a StatefulSet scaled down or given a new template first: no pod made again as it was)

A job gone or being deleted ends the reconcile with None: its loop forgets it.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from psoperator.api.labels import CHILD_KINDS, QUEUE_KINDS
from psoperator.api.models import TrackedPod, Tracking
from psoperator.contract import ProgressReport, RejectedReport
from psoperator.control import chief_client, decision_cache, kueue
from psoperator.control.state import JobState, OperatorState
from psoperator.faults import Fault, crash_at
from psoperator.kube import ApplyResult, in_thread
from psoperator.metrics.readings import read_job
from psoperator.observe.cache import JobKey, Snapshot
from psoperator.observe.failures import unexplained
from psoperator.observe.views import Observed, PodView, build_observed, owned_by, parse_pod
from psoperator.plan.children import ChildChange, children_fingerprint, plan_children, with_chief_token
from psoperator.plan.draft import PodDeletion, ReconcilePlan
from psoperator.plan.stages import plan_reconcile
from psoperator.policies import node_lost
from psoperator.policies.queueing import WorkloadPatch
from psoperator.render import render_chief_token, render_children
from psoperator.status.patch import merge_patch

Obj = dict[str, Any]
UNEXPLAINED_RETRIES, UNEXPLAINED_WAIT = 6, 0.5
# A status change that needs nothing else (pods coming up one by one, the step) is written at most
# this often; anything that acts (a restart, a child, an event) or a parameter server's tracking
# (ReconcilePlan.write_now) writes at once.
STATUS_SPACING_SECONDS = 5.0
# A plan that waits for pods to go (ReconcilePlan.awaits_departure) reads fresh at least this often:
# a watch that re-listed (410 Gone, a cut stream) sends no DELETED for a pod gone meanwhile, and
# the cache would hold the new chief until the next periodic one (OperatorState.fresh_read_interval).
DEPARTURE_RECHECK_SECONDS = 10.0
# The children a reconcile about to act reads fresh, besides the job and its pods: its chief Jobs,
# whose attempt a restart decides on, and a queued job's Workload, whose admission Kueue writes. The
# other children are the cache's, which has the operator's own writes from their answers (act): one
# the watch has not shown yet is created again, and the API server's 409 tells the job's own from a
# stranger's (Kube._exists).
ACT_READ = ("Job", *QUEUE_KINDS)


@dataclass(frozen=True)
class Decision:
    plan: ReconcilePlan
    report: ProgressReport | None
    changes: list[ChildChange]
    conflicts: list[str]  # children's names taken by objects the job does not own (plan_children)
    now: datetime
    inputs: tuple[Any, ...] | None = None  # what decided the changes (sync_inputs)
    facts: tuple[Any, ...] | None = None  # what it was decided from (decision_cache.inputs_of)
    stands: bool = False  # the job's settled decision, standing: nothing to do, nothing to write

    @property
    def quiet(self) -> bool:
        """Nothing to do beyond a status write: no child to change, pod to delete, restart or event."""
        plan = self.plan
        acts = plan.restarted or plan.delete_job or plan.delete_pods or plan.events or plan.failures
        asks = plan.ask_checkpoint is not None or plan.workload_patch is not None
        return not (acts or asks or plan.write_now or self.changes or self.conflicts)


async def read_fresh(
    state: OperatorState, job_state: JobState, key: JobKey, full: bool = True
) -> Snapshot | None:
    """The job, its pods and its children (`full`; else those of ACT_READ) from the API and into the
    cache, the other children from the cache; None once the job is gone. All at once: whether its
    Workloads are read is told by the job the cache has, and by the one read if that says otherwise."""
    started = time.monotonic()
    held = state.cache.snapshot(key)
    queued = held is not None and await kueue.lists_workloads(state, held.job)
    kinds = [kind for kind in (CHILD_KINDS if full else ACT_READ) if queued or kind not in QUEUE_KINDS]
    job, pods, *listed = await asyncio.gather(
        in_thread(state.kube.get_job, *key),
        in_thread(state.kube.list_pods, *key, parse_pod),
        *(in_thread(state.kube.list_children, *key, kind) for kind in kinds),
    )
    if job is None:
        return None
    if not queued and await kueue.lists_workloads(state, job):  # queued since the cache saw it
        listed += await asyncio.gather(*(in_thread(state.kube.list_children, *key, k) for k in QUEUE_KINDS))
        kinds += QUEUE_KINDS
    children = [child for kind in listed for child in kind]
    read = None if full else kinds
    state.remember_vanished(state.cache.read_fresh(key, job, children, pods, started, read))
    job_state.pods_read_at = started
    if full:
        job_state.read_at = started
        return Snapshot(job, children, pods)
    cached = state.cache.snapshot(key)
    kept = [c for c in cached.children if c["kind"] not in kinds] if cached is not None else []
    return Snapshot(job, children + kept, pods)


async def read_pods(state: OperatorState, job_state: JobState, key: JobKey) -> Snapshot | None:
    """The job's pods from the API into the cache, the rest from the cache: for a job never acted
    on, which the watch shows no pod of an earlier job of its name (it dropped them with that job)."""
    started = time.monotonic()
    pods = await in_thread(state.kube.list_pods, *key, parse_pod)
    held = state.cache.snapshot(key)
    if held is None:
        return None
    state.remember_vanished(state.cache.read_fresh(key, held.job, [], pods, started, ()))
    job_state.pods_read_at = started
    return state.cache.snapshot(key)


async def observe(
    state: OperatorState, seen: Snapshot, fresh: bool, tracking: dict[str, TrackedPod]
) -> Observed:
    """What the reconcile sees of the job: its own children and pods, with the nodes of the pods,
    waiting a little for how the `tracking`'s pods that went away ended."""
    job = seen.job
    name, uid = job["metadata"]["name"], job["metadata"]["uid"]
    ours = [c for c in seen.children if owned_by(c, uid)]

    def of(listed: list[PodView]) -> Observed:
        return build_observed(ours, listed, name, dict(state.departed))

    observed, key = of(seen.pods), (job["metadata"]["namespace"], name)
    # A pod replaced between two reconciles: its last state may still be on its way through the watch.
    # Wait for it a little, so the failure is classified by what happened instead of "Replaced".
    lost = unexplained(tracking, observed.pods, observed.departed)
    for _ in range(UNEXPLAINED_RETRIES):
        if not lost:
            break
        await asyncio.sleep(UNEXPLAINED_WAIT)
        cached = state.cache.snapshot(key)
        pods = (
            await in_thread(state.kube.list_pods, *key, parse_pod) if fresh or cached is None else cached.pods
        )
        observed = of(pods)
        lost = unexplained(tracking, observed.pods, observed.departed)
    if lost:  # still not told: the last state the watch showed before the pod vanished (a
        # DisruptionTarget it delivered before a lagging deletion says preempted, not deleted)
        vanished = {uid: state.vanished[uid] for uid in lost if uid in state.vanished}
        observed = replace(observed, departed={**observed.departed, **vanished})
    observed = replace(observed, kueue=await kueue.kueue_view(state, job, observed))
    return with_nodes(state, observed)


def with_nodes(state: OperatorState, observed: Observed) -> Observed:
    """The nodes of the job's pods, for the node-lost policy, from the node index."""
    index = state.nodes
    names = node_lost.nodes_of(observed)
    if index is None or not names:
        return observed
    return replace(observed, nodes={n: next(iter(index[n]), None) if n in index else None for n in names})


def sync_inputs(job: Obj, plan: ReconcilePlan, children: list[Obj]) -> tuple[Any, ...]:
    """All that decides which children to change: what the renderer reads of the job (besides its
    uid, the key: its spec, by its generation; not its resourceVersion, which every status write
    changes) and the render options, the plan's flags and what plan_children reads of the observed
    children."""
    meta = job["metadata"]
    fingerprint = children_fingerprint(meta["uid"], children)
    return (meta.get("generation"), plan.render, plan.create_missing, plan.hold_chief, fingerprint)


async def decide(
    state: OperatorState,
    job_state: JobState,
    seen: Snapshot,
    fresh: bool,
    report: ProgressReport | None = None,
) -> Decision:
    job = seen.job
    tracking = Tracking.model_validate((job.get("status") or {}).get("tracking") or {}).pods
    observed = await observe(state, seen, fresh, tracking)
    if report is None:
        attempt = int((job.get("status") or {}).get("restarts") or 0)
        port, chief = state.config.progress_port, observed.chief_pod(attempt)
        given, job_state.refusals = await chief_client.chief_report(
            state.session, port, chief, job_state.refusals, chief_token(state, job)
        )
        report = accepted(job_state, job, given)
    now = datetime.now(UTC)
    tracked = {entry.uid for entry in tracking.values()}
    facts = decision_cache.inputs_of(
        seen, observed, tracked, report, job_state.checkpoint_outcome, state.kueue_served
    )
    standing = job_state.settled.stands(facts, time.monotonic()) if job_state.settled and not fresh else None
    if standing is not None:
        return Decision(standing, report, [], [], now, stands=True)
    plan = plan_reconcile(
        job,
        observed,
        report,
        now,
        cluster_domain=state.config.cluster_domain,
        operator_namespace=state.config.operator_namespace,
        operator_pod_labels=state.config.operator_pod_labels,
        checkpoint_outcome=job_state.checkpoint_outcome,
        unmade={ref: message for ref, (_, message) in job_state.unmade.items()},
    )
    if plan.render is None:
        return Decision(plan, report, [], [], now, facts=facts)
    inputs = sync_inputs(job, plan, seen.children)
    # A child that could not be made is tried again at a fresh read (the periodic one at
    # least): the object in its way may carry no job label, and then no watch sees it go.
    if job_state.in_sync == inputs and not (fresh and job_state.unmade):
        # The same as when its children were last found as rendered: a Running job's reconciles
        # render nothing (rendering is most of their CPU), and nothing rendered is kept per job.
        return Decision(plan, report, [], [], now, facts=facts)
    desired = render_children(job, plan.render)
    changes, conflicts = plan_children(
        job["metadata"]["uid"],
        desired,
        seen.children,
        create_missing=plan.create_missing,
        hold_chief=plan.hold_chief,
    )
    token = chief_token(state, job)
    if token is not None:
        changes = with_chief_token(changes, render_chief_token(job, token))
    if not changes and not conflicts:
        job_state.in_sync = inputs
    return Decision(plan, report, changes, conflicts, now, inputs, facts)


def accepted(
    job_state: JobState, job: Any, report: ProgressReport | RejectedReport | None
) -> ProgressReport | None:
    """The chief's report to decide with; a rejected one is told (a Warning, once while the chief
    keeps giving it) and the job decided without it, from its pods as for a chief that reports
    nothing."""
    if not isinstance(report, RejectedReport):
        if report is not None:
            job_state.rejected = None
        return report
    if report != job_state.rejected:
        kopf.warn(job, reason="InvalidProgressReport", message=report.reason)
        job_state.rejected = report
    return None


def chief_token(state: OperatorState, job: Obj) -> str | None:
    """The job's chief token (control/chief_key.py), never logged; None without a key."""
    key = state.config.chief_key
    return key.token(job["metadata"]["uid"]) if key is not None else None


def never_acted_on(seen: Snapshot | None) -> bool:
    """A job with no status has no children of ours: every reconcile writes the status before it
    creates anything. Deciding on it needs no fresh read of the job and its children: its status
    write names the version it was decided on, and the API server refuses it (StaleJob) if another
    writer came first."""
    return seen is not None and not seen.job.get("status")


async def reconcile_once(
    state: OperatorState, namespace: str, name: str, logger: Any
) -> ReconcilePlan | None:
    """Decide from the cache; read fresh (ACT_READ) and decide again before acting or when a wait
    for pods to go outlasts DEPARTURE_RECHECK_SECONDS since their last read; read in full when the
    job has none (a new loop) or its last is older than `state.fresh_read_interval()` and the
    periodic reads' pace lets it (state.may_read_periodically), unless the job was never acted on;
    or when the cache has none of it. After a refused status write (JobState.stale), read fresh
    (ACT_READ at least) before deciding."""
    started = time.monotonic()
    key = (namespace, name)
    job_state = state.job(key, logger)
    seen = state.cache.snapshot(key)
    new = never_acted_on(seen)  # decided and acted on from the watch and its pods read
    # A job's first read (a new loop: the watches may not have listed its children yet) is not paced;
    # -inf is a full read due at its turn (after a failed reconcile).
    first = job_state.read_at is None
    last_read = -math.inf if job_state.read_at is None else job_state.read_at
    due = not first and started - last_read >= state.fresh_read_interval()  # its periodic read
    full = seen is None or (not new and (first or (due and state.may_read_periodically(started))))
    fresh = full or job_state.stale  # a refused status write: the job, at least, is read again
    if fresh:
        seen = await read_fresh(state, job_state, key, full)
        job_state.stale = False
    elif new:
        seen = await read_pods(state, job_state, key)
    if seen is None or seen.job["metadata"].get("deletionTimestamp"):
        return None
    decision = await decide(state, job_state, seen, fresh)
    if decision.stands:
        return decision.plan
    pods_read = max(last_read, job_state.pods_read_at)
    waited = started - pods_read >= DEPARTURE_RECHECK_SECONDS
    recheck = not fresh and not new and decision.plan.awaits_departure and waited
    since_write = started - job_state.written_at
    if decision.quiet and since_write < STATUS_SPACING_SECONDS and not recheck:
        wait = STATUS_SPACING_SECONDS - since_write
        requeue = wait if decision.plan.requeue_after is None else min(wait, decision.plan.requeue_after)
        return replace(decision.plan, requeue_after=requeue)
    if recheck or (not fresh and not new and not decision.quiet):
        seen = await read_fresh(state, job_state, key, full=False)
        if seen is None or seen.job["metadata"].get("deletionTimestamp"):
            return None
        decision = await decide(state, job_state, seen, True, decision.report)
    wrote = await act(state, job_state, seen, decision, logger)
    changed_nothing = decision.quiet and not wrote
    kept = seen.job.get("status") or {}
    job_state.settled = (
        decision_cache.settle(decision.plan, kept, decision.facts, started, decision.now)
        if changed_nothing
        else None
    )
    return decision.plan


async def act(
    state: OperatorState, job_state: JobState, seen: Snapshot, decision: Decision, logger: Any
) -> bool:
    """Write the status once and post the plan's events (they fire when a condition flips, so a
    later reconcile would not post them again: a child write refused below must not lose them), then
    carry out the plan. Returns whether the status needed a write (or the Lease forbade acting)."""
    job: Any = seen.job  # kopf's event functions take the raw object (typed as their Body)
    plan = decision.plan
    namespace, name, uid = job["metadata"]["namespace"], job["metadata"]["name"], job["metadata"]["uid"]
    if not state.may_act():  # decided while the Lease ran out: the other replica acts now
        logger.info("not acting: this replica's Lease is past its renew deadline")
        return True
    patch = merge_patch(job.get("status") or {}, plan.status)
    if patch:
        version = job["metadata"]["resourceVersion"]
        written = await in_thread(state.kube.patch_job_status, namespace, name, patch, version)
        state.cache.job_seen(namespace, name, written)
        job_state.written_at = time.monotonic()
    for event in plan.events:
        kopf.event(job, type=event.type, reason=event.reason, message=event.message)
    state.metrics.record(namespace, name, read_job(job, plan, decision.now))
    if plan.restarted:
        crash_at(Fault.EXIT_AFTER_RESTART_STATUS_WRITE, state.config.faults)
    if plan.workload_patch is not None:
        await write_workload_status(state, namespace, plan.workload_patch)
    if plan.ask_checkpoint is not None:  # the stop waits for the answer (up to the ask's deadline)
        port = state.config.progress_port
        ask, refusals, token = plan.ask_checkpoint, job_state.refusals, chief_token(state, job)
        job_state.checkpoint_outcome = await chief_client.ask_checkpoint(
            state.session, port, ask, refusals, token
        )
    if plan.delete_job:
        # kopf.event, not kopf.info: kopf posts info only at its INFO posting level (ours is WARNING).
        kopf.event(
            job, type="Normal", reason="Expired", message="ttlSecondsAfterFinished passed: deleting the job"
        )
        await in_thread(state.kube.delete_job, namespace, name, uid)
        return True
    children = change_children(state, job_state, job, decision, logger)
    # A stopping job's drain cuts first (PodDeletion.first): a pod they delete keeps its name until
    # it is gone, so its StatefulSet, scaled down right after, makes no new one.
    await delete_pods(state, namespace, [d for d in plan.delete_pods if d.first])
    later = [d for d in plan.delete_pods if not d.first]
    if any(change.manifest["kind"] == "StatefulSet" for change in decision.changes):
        # The children first: a StatefulSet's scale-down (a stop) or new template (a resize;
        # OnDelete) is in place before its pods go, or its controller makes them again as they were.
        await children
        await delete_pods(state, namespace, later)
    else:  # a restart's old chief Job goes with its pods: one round trip to the API server, not two
        await asyncio.gather(children, delete_pods(state, namespace, later))
    return bool(patch)


async def change_children(
    state: OperatorState, job_state: JobState, job: Any, decision: Decision, logger: Any
) -> None:
    """Make the decision's child changes; keep what the API server answered in the watch cache."""
    if not (decision.changes or decision.conflicts):
        return
    namespace = job["metadata"]["namespace"]
    result = await in_thread(state.kube.make_changes, namespace, decision.changes, decision.conflicts)
    for child in result.written:
        state.cache.child_seen("MODIFIED", child)
    tell_unmade(job_state, job, decision, result)
    if result.created or result.deleted:
        logger.info("created %s, deleted %s", result.created, result.deleted)


async def delete_pods(state: OperatorState, namespace: str, deletions: list[PodDeletion]) -> None:
    """At once: a restart stops the old chief and every PS that served it (49 of them in a big job)."""
    await asyncio.gather(*(in_thread(state.kube.delete_pod, namespace, d) for d in deletions))


async def write_workload_status(state: OperatorState, namespace: str, patch: WorkloadPatch) -> None:
    """A Workload's status as the plan computed it, unless Kueue wrote it since (409) or it is gone
    (404): the next reconcile decides again from what is there."""
    try:
        await in_thread(
            state.kube.patch_workload_status, namespace, patch.name, patch.status, patch.resource_version
        )
    except ApiException as error:
        if error.status not in (404, 409):
            raise


def tell_unmade(job_state: JobState, job: Any, decision: Decision, result: ApplyResult) -> None:
    """Warn of the children that could not be made as rendered, each once while it lasts; and stay
    quiet (no fresh read, no retry) until what decided the changes changes (the conflicting object
    changes or goes away, the job's spec or the plan does) or the job's next fresh read."""
    message = "{} exists and is not owned by this job; left alone"
    unmade = {ref: ("NameConflict", message.format(ref)) for ref in result.conflicts}
    unmade |= {ref: ("ChildRejected", f"{ref}: {why}") for ref, why in result.rejected.items()}
    for reason, message in sorted(set(unmade.values()) - set(job_state.unmade.values())):
        kopf.warn(job, reason=reason, message=message)
    job_state.unmade = unmade
    if unmade and decision.inputs is not None:
        job_state.in_sync = decision.inputs

"""The kopf layer: the handlers kopf calls, each a few lines.

At start-up, kopf is configured (no finalizer, the children's watches filtered to the job label,
lists a page at a time) and the operator waits for its CRD to be served; with leader election, the
elector starts the jobs' loops when this replica takes the Lease (the process exits when it loses
it). The watch handlers keep the watch cache (observe/cache.py) and start, wake or stop a job's
loop (control/loop.py), which reconciles it (control/reconciler.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from psoperator import GROUP, PLURAL, VERSION
from psoperator.api.labels import LABEL_JOB
from psoperator.control import chief_client, memory_trim
from psoperator.control.leader import Elector
from psoperator.control.loop import lead, start_loop, stop_loop, stop_loops, wake
from psoperator.control.state import OperatorState
from psoperator.kube import API_CONCURRENCY, LIST_PAGE, in_thread, lease_client
from psoperator.observe.views import NodeView, parse_node, parse_pod

# The children's watches (kopf resource selectors), each filtered by the API server to the objects
# that carry the job label (settings.watching.label_selectors): other pods never reach the operator.
PODS = ("v1", "pods")
CHILDREN = (
    ("v1", "services"),
    ("apps", "v1", "statefulsets"),
    ("batch", "v1", "jobs"),
    ("v1", "configmaps"),
    ("networking.k8s.io", "v1", "networkpolicies"),
    # A queued job's Workload; kopf watches it only where Kueue is installed.
    ("kueue.x-k8s.io", "v1beta2", "workloads"),
)
# How often a starting operator asks whether its CRD is served yet.
CRD_POLL_SECONDS = 2.0
# How long kopf keeps an object's worker after its last event (the next event makes another).
WORKER_IDLE_SECONDS = 0.5


def _state(memo: Any) -> OperatorState:
    state = memo.state
    assert isinstance(state, OperatorState)
    return state


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base tells change handlers (on.create, on.update, on.resume) what changed; the
    operator has none, only event handlers. kopf still builds one for every watch event, a deep copy
    of the object (about 110 us for a pod), and reads the last one from an annotation: this builds an
    empty one and keeps nothing."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Never called: kopf stores a diff base only after change handlers."""


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # No handler needs a finalizer; kopf removes this one (put on jobs by versions that ran kopf
    # daemons) from every job it sees, so upgraded clusters are not left with undeletable jobs.
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # kopf lists each watched kind before it watches, and hands every listed object to a worker of
    # its own that keeps the object whole until it has handled it, then idles for idle_timeout (5 s
    # by default) before it goes. Listed a page at a time, the next page comes only after the
    # handlers had a turn, so a restart on many jobs never holds every pod, child and job whole at
    # once; idle workers go after WORKER_IDLE_SECONDS, so the objects they held do not raise the
    # interpreter's high-water mark, which it keeps for good (its small-object arenas). A restart's
    # peak RSS: docs/performance.md, Steady.
    settings.watching.chunk_size = LIST_PAGE
    settings.queueing.idle_timeout = WORKER_IDLE_SECONDS
    settings.networking.request_timeout = _state(memo).kube.timeout
    for resource in (PODS, *CHILDREN):
        settings.watching.label_selectors[resource] = LABEL_JOB
    state = _state(memo)
    state.session = chief_client.chief_session()
    # The API calls' threads (kube.in_thread); kopf runs its sync handlers in an executor of its own.
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(API_CONCURRENCY, thread_name_prefix="kube")
    )
    state.metrics.leader.set(1 if state.election is None else 0)
    if state.election is not None:
        loop = asyncio.get_running_loop()
        lease = lease_client(state.election.request_timeout, on_response=state.metrics.api_request)
        state.elector = Elector(lease, state.election, lead=lambda: loop.call_soon_threadsafe(lead, state))
        state.kube.may_write = state.elector.holds  # no write once this replica may have lost the Lease
        state.elector.start()
    state.trim_task = asyncio.create_task(memory_trim.trim_every(), name="memory-trim")


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


@kopf.on.cleanup()
async def close(memo: Any, **_: Any) -> None:
    state = _state(memo)
    if state.trim_task is not None:
        state.trim_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await state.trim_task
    await stop_loops(state)
    if state.elector is not None:
        await state.elector.stop()  # writes nothing more, then frees the Lease
    session = state.session
    if session is not None:
        await session.close()


@kopf.on.probe(id="jobs")
def probe_jobs(memo: Any, **_: Any) -> int:
    return len(_state(memo).looping())


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
        await stop_loop(state, key)
        state.forget(key)
        return
    changed = state.cache.job_seen(namespace, name, dict(body))
    state.job(key, logger).logger = logger
    if state.context is None:
        state.context = contextvars.copy_context()
    if state.leading and not start_loop(state, key, logger) and changed:
        wake(state, key)


@kopf.on.event(*PODS, labels={LABEL_JOB: kopf.PRESENT}, id="pod-changed")
async def pod_changed(type: str, body: kopf.Body, memo: Any, logger: Any, **_: Any) -> None:
    state = _state(memo)
    view = parse_pod(dict(body))
    if type == "DELETED" or view.deleting or view.phase in ("Failed", "Succeeded"):
        state.remember_departed(view)
        logger.debug("pod %s (%s) ended: %s %s", view.name, view.uid, view.phase, view.disruption)
    wake(state, state.cache.pod_seen(type, dict(body), view))


@kopf.on.event(*CHILDREN[0], labels={LABEL_JOB: kopf.PRESENT}, id="service-changed")
@kopf.on.event(*CHILDREN[1], labels={LABEL_JOB: kopf.PRESENT}, id="statefulset-changed")
@kopf.on.event(*CHILDREN[2], labels={LABEL_JOB: kopf.PRESENT}, id="job-child-changed")
@kopf.on.event(*CHILDREN[3], labels={LABEL_JOB: kopf.PRESENT}, id="configmap-changed")
@kopf.on.event(*CHILDREN[4], labels={LABEL_JOB: kopf.PRESENT}, id="networkpolicy-changed")
@kopf.on.event(*CHILDREN[5], labels={LABEL_JOB: kopf.PRESENT}, id="workload-changed")
async def child_changed(type: str, body: kopf.Body, memo: Any, **_: Any) -> None:
    state = _state(memo)
    wake(state, state.cache.child_seen(type, dict(body)))

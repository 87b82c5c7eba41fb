"""The kopf layer (handlers.py): its settings, the watches' filters and wake-ups, a job's loop
started with it and stopped with it, and the loops started by taking the Lease."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any, cast

import kopf
import pytest

from psoperator import GROUP, handlers
from psoperator.api.labels import LABEL_JOB
from psoperator.api.vocabulary import Phase
from psoperator.control import chief_client, loop
from psoperator.control.state import Config, JobState, OperatorState
from psoperator.kube import LIST_PAGE
from psoperator.metrics.readings import JobReading
from psoperator.metrics.registry import Metrics
from psoperator.plan.stages import ReconcilePlan
from tests.unit import builders
from tests.unit.test_kube import RecordingKube


def test_no_handler_makes_kopf_put_a_finalizer_on_jobs() -> None:
    """A job must stay deletable while the operator is stopped: its children go by owner references."""
    registry = kopf.get_default_registry()
    spawning = registry._spawning.get_all_handlers()
    changing = registry._changing.get_all_handlers()
    assert not [h.id for h in [*spawning, *changing] if getattr(h, "requires_finalizer", False)]


def test_kopf_builds_no_diff_base_since_no_handler_reads_one() -> None:
    """kopf's diff base (a deep copy of every watched object at each event) is for change and spawning
    handlers; the operator has only event handlers and indexes, so it builds an empty one."""
    registry = kopf.get_default_registry()
    assert not [*registry._spawning.get_all_handlers(), *registry._changing.get_all_handlers()]
    storage = _configured().persistence.diffbase_storage
    pod = kopf.Body(cast(kopf.RawBody, builders.pod("ps", 0)))
    assert storage.build(body=pod) == {} and storage.fetch(body=pod) is None


def test_the_finalizer_of_older_versions_keeps_its_name_so_kopf_removes_it() -> None:
    """kopf takes off the configured finalizer from a job when no handler needs one any more."""

    assert _configured().persistence.finalizer == f"{GROUP}/finalizer"


def test_kopf_lists_a_page_at_a_time_and_lets_an_idle_objects_worker_go_soon() -> None:
    """An operator restarted with 1,000 jobs must not hold every listed object whole at once, nor
    a worker for each of them: kopf's default keeps a worker 5 s after its object's last event."""
    settings = _configured()
    assert settings.watching.chunk_size == LIST_PAGE
    assert settings.queueing.idle_timeout == handlers.WORKER_IDLE_SECONDS <= 1.0


def _configured() -> kopf.OperatorSettings:
    """kopf's settings after the operator's startup handler (its clean-up run too)."""

    async def configure() -> kopf.OperatorSettings:
        settings = kopf.OperatorSettings()
        memo = kopf.Memo(state=OperatorState(RecordingKube(), Metrics()))
        await _kopf_fn(handlers.configure)(settings=settings, memo=memo)
        await _kopf_fn(handlers.close)(memo=memo)
        return settings

    return asyncio.run(configure())


def _kopf_fn(fn: Any) -> Any:
    """A handler as kopf calls it: with the keyword arguments it needs only (kopf types it stricter)."""
    return fn


class _Body(dict[str, Any]):
    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self.get("metadata") or {})


def test_a_deleted_job_stops_its_loop_and_is_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    reconciled: list[str] = []

    async def fake_reconcile(_state: Any, namespace: str, name: str, _logger: Any) -> ReconcilePlan:
        reconciled.append(f"{namespace}/{name}")
        return ReconcilePlan(status={}, render=None)

    monkeypatch.setattr(loop, "reconcile_once", fake_reconcile)
    state = OperatorState(RecordingKube(), Metrics())
    memo = kopf.Memo(state=state)
    log = logging.getLogger("test")

    async def scenario() -> None:
        body = _Body(metadata={"name": "ctr", "namespace": "ns"})
        await _kopf_fn(handlers.job_changed)(
            type=None, body=body, namespace="ns", name="ctr", memo=memo, logger=log, node_health={}
        )
        await asyncio.sleep(0.05)
        assert reconciled == ["ns/ctr"] and state.jobs[("ns", "ctr")].loop is not None
        state.metrics.record("ns", "ctr", JobReading(phase=Phase.RUNNING, step=3))
        await _kopf_fn(handlers.job_changed)(
            type="DELETED", body=body, namespace="ns", name="ctr", memo=memo, logger=log, node_health={}
        )
        assert ("ns", "ctr") not in state.jobs
        phases = [
            s for m in state.metrics.registry.collect() for s in m.samples if s.labels.get("psjob") == "ctr"
        ]
        assert phases == []

    asyncio.run(scenario())


def test_a_loop_that_ends_by_itself_forgets_everything_of_its_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job deleted while its watch event is still on the way: the loop ends, and nothing of the job
    is left: not its state, its cached objects (job, pods, children, read times) nor its series."""
    key = ("ns", "ctr")
    pod = {"metadata": {"name": "ctr-ps-0", "namespace": "ns", "uid": "p", "labels": {LABEL_JOB: "ctr"}}}
    child = {
        "kind": "Service",
        "metadata": {"name": "ctr-ps", "namespace": "ns", "labels": {LABEL_JOB: "ctr"}},
    }

    async def gone(state: OperatorState, *_: Any) -> None:
        """What reconciles left before the job went, then the fresh read that finds it gone."""
        job = state.jobs[key]
        job.in_sync, job.refusals = ("inputs",), chief_client.Refusals("chief-uid", 1, 0.0)
        job.read_at = job.written_at = 1.0
        state.metrics.record(*key, JobReading(phase=Phase.RUNNING, step=3))
        return None

    monkeypatch.setattr(loop, "reconcile_once", gone)
    state = OperatorState(RecordingKube(), Metrics())
    memo = kopf.Memo(state=state)

    async def scenario() -> None:
        body = _Body(metadata={"name": "ctr", "namespace": "ns"})
        log = logging.getLogger("test")
        await _kopf_fn(handlers.pod_changed)(type="ADDED", body=_Body(pod), memo=memo, logger=log)
        await _kopf_fn(handlers.child_changed)(type="ADDED", body=_Body(child), memo=memo)
        await _kopf_fn(handlers.job_changed)(
            type=None, body=body, namespace="ns", name="ctr", memo=memo, logger=log, node_health={}
        )
        await asyncio.sleep(0.05)
        assert state.jobs == {} and state.cache.snapshot(key) is None
        assert key not in state.cache.jobs
        series = [
            s for m in state.metrics.registry.collect() for s in m.samples if s.labels.get("psjob") == "ctr"
        ]
        assert series == [] and state.metrics.registry.get_sample_value("psoperator_jobs_managed") == 0

    asyncio.run(scenario())


def test_children_watches_are_filtered_by_the_api_server_to_the_job_label() -> None:
    """kopf puts settings.watching.label_selectors into every watch's and list's labelSelector
    (kopf/_cogs/clients/watching.py, fetching.py); a handler's `labels=` filter is client-side only."""
    from kopf._cogs.structs.references import Resource

    selectors = _configured().watching.label_selectors
    for group, version, plural in [
        ("", "v1", "pods"),
        ("", "v1", "services"),
        ("", "v1", "configmaps"),
        ("apps", "v1", "statefulsets"),
        ("batch", "v1", "jobs"),
        ("networking.k8s.io", "v1", "networkpolicies"),
    ]:
        assert selectors.collect(Resource(group, version, plural)) == [LABEL_JOB], plural
    # The jobs themselves and the nodes are watched whole.
    assert selectors.collect(Resource(GROUP, "v1alpha1", "pstrainingjobs")) == []
    assert selectors.collect(Resource("", "v1", "nodes")) == []


def test_watch_handlers_that_wake_a_loop_run_on_the_event_loop() -> None:
    """asyncio.Event is not thread-safe, and kopf runs sync handlers in executor threads."""
    for handler in (handlers.job_changed, handlers.pod_changed, handlers.child_changed):
        assert asyncio.iscoroutinefunction(handler), handler


def test_a_job_is_woken_by_its_spec_and_children_but_not_by_its_own_status(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reconciled: list[int] = []

    async def count(_state: Any, namespace: str, name: str, _logger: Any) -> ReconcilePlan:
        reconciled.append(len(reconciled))
        return ReconcilePlan(status={"phase": "Running"}, render=None)

    monkeypatch.setattr(loop, "reconcile_once", count)
    state = OperatorState(RecordingKube(), Metrics(), Config(resync_seconds=3600))
    memo = kopf.Memo(state=state)
    log = logging.getLogger("test")

    def body(generation: int, version: int, step: int) -> _Body:
        meta = {"name": "ctr", "namespace": "ns", "generation": generation, "resourceVersion": str(version)}
        return _Body(metadata=meta, status={"step": step})

    async def event(generation: int, version: int, step: int) -> None:
        await _kopf_fn(handlers.job_changed)(
            type="MODIFIED", body=body(generation, version, step), namespace="ns", name="ctr",
            memo=memo, logger=log, node_health={},
        )  # fmt: skip
        await asyncio.sleep(0.4)  # past the loop's 0.2 s settling

    async def scenario() -> None:
        await event(1, 1, 0)
        assert reconciled == [0]
        await event(1, 2, 10)  # the echo of its own status write
        assert reconciled == [0]
        pod = {"metadata": {"name": "ctr-ps-0", "namespace": "ns", "labels": {LABEL_JOB: "ctr"}}}
        await _kopf_fn(handlers.pod_changed)(type="MODIFIED", body=_Body(pod), memo=memo, logger=log)
        await asyncio.sleep(0.4)
        assert reconciled == [0, 1]
        await event(2, 3, 10)  # the spec changed
        assert reconciled == [0, 1, 2]
        await loop.stop_loop(state, ("ns", "ctr"))

    asyncio.run(scenario())


def test_taking_the_lease_starts_the_loops_and_sets_the_leader_gauge(monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking the Lease starts the known jobs' loops and says so in psoperator_leader (a replica that
    loses it exits: control/leader.py)."""

    async def idle(*_: Any) -> ReconcilePlan:
        await asyncio.sleep(3600)
        return ReconcilePlan(status={}, render=None)

    monkeypatch.setattr(loop, "reconcile_once", idle)
    state = OperatorState(RecordingKube(), Metrics())
    state.jobs[("ns", "ctr")] = JobState(logging.getLogger("ctr"))

    def leader() -> float | None:
        return state.metrics.registry.get_sample_value("psoperator_leader")

    async def scenario() -> None:
        assert leader() == 0
        loop.lead(state)
        assert leader() == 1 and state.jobs[("ns", "ctr")].loop is not None
        await loop.stop_loops(state)

    asyncio.run(scenario())


HANDLER_ONLY: contextvars.ContextVar[str] = contextvars.ContextVar("handler_only")


def test_every_loop_runs_in_the_first_job_handlers_context_not_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kopf keeps what its event posting needs in context variables of the handler: every loop,
    also one started when this replica takes the Lease over, runs in a copy of the context the
    first job's handler left, and can post events instead of failing at the first (LookupError).
    Not in its own handler's: that would keep the event's whole job for the loop's life."""
    seen: list[str] = []

    async def reconcile(*_: Any) -> ReconcilePlan:
        seen.append(HANDLER_ONLY.get("missing"))
        await asyncio.sleep(3600)
        return ReconcilePlan(status={}, render=None)

    monkeypatch.setattr(loop, "reconcile_once", reconcile)
    state = OperatorState(RecordingKube(), Metrics(), Config(resync_seconds=3600))
    memo, log = kopf.Memo(state=state), logging.getLogger("test")

    async def job_event(name: str) -> None:
        HANDLER_ONLY.set(f"{name}'s handler")
        meta = {"name": name, "namespace": "ns", "generation": 1, "resourceVersion": "1"}
        await _kopf_fn(handlers.job_changed)(
            type="ADDED", body=_Body(metadata=meta), namespace="ns", name=name, memo=memo, logger=log,
            node_health={},
        )  # fmt: skip

    async def scenario() -> None:
        await asyncio.create_task(job_event("first"))  # each event has a context of its own
        await asyncio.create_task(job_event("second"))
        await loop.stop_loops(state)
        loop.lead(state)  # both loops again, started from the election's side
        await asyncio.sleep(0.01)
        await loop.stop_loops(state)

    asyncio.run(scenario())
    assert seen == ["first's handler"] * 4

"""The kopf layer's own decisions: no finalizer on jobs, and one reconcile loop per job that ends with it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from psoperator import GROUP, handlers
from psoperator.metrics import Metrics
from psoperator.readings import JobReading
from psoperator.reconcile import ReconcilePlan
from psoperator.vocabulary import Phase
from tests.unit.test_kube import RecordingKube


def test_no_handler_makes_kopf_put_a_finalizer_on_jobs() -> None:
    """A job must stay deletable while the operator is stopped: its children go by owner references."""
    registry = kopf.get_default_registry()
    spawning = registry._spawning.get_all_handlers()
    changing = registry._changing.get_all_handlers()
    assert not [h.id for h in [*spawning, *changing] if getattr(h, "requires_finalizer", False)]


def test_the_finalizer_of_older_versions_keeps_its_name_so_kopf_removes_it() -> None:
    """kopf takes off the configured finalizer from a job when no handler needs one any more."""

    async def configure() -> kopf.OperatorSettings:
        settings = kopf.OperatorSettings()
        memo = kopf.Memo(state=handlers.OperatorState(RecordingKube(), Metrics()))
        await _kopf_fn(handlers.configure)(settings=settings, memo=memo)
        await _kopf_fn(handlers.close)(memo=memo)
        return settings

    assert asyncio.run(configure()).persistence.finalizer == f"{GROUP}/finalizer"


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

    monkeypatch.setattr(handlers, "reconcile_once", fake_reconcile)
    state = handlers.OperatorState(RecordingKube(), Metrics())
    memo = kopf.Memo(state=state)
    log = logging.getLogger("test")

    async def scenario() -> None:
        body = _Body(metadata={"name": "ctr", "namespace": "ns"})
        await _kopf_fn(handlers.job_changed)(
            type=None, body=body, namespace="ns", name="ctr", memo=memo, logger=log, node_health={}
        )
        await asyncio.sleep(0.05)
        assert reconciled == ["ns/ctr"] and ("ns", "ctr") in state.loops
        state.metrics.record("ns", "ctr", JobReading(phase=Phase.RUNNING, step=3))
        await _kopf_fn(handlers.job_changed)(
            type="DELETED", body=body, namespace="ns", name="ctr", memo=memo, logger=log, node_health={}
        )
        assert ("ns", "ctr") not in state.loops and ("ns", "ctr") not in state.wakeups
        phases = [
            s for m in state.metrics.registry.collect() for s in m.samples if s.labels.get("psjob") == "ctr"
        ]
        assert phases == []

    asyncio.run(scenario())


def test_a_loop_ends_by_itself_when_the_job_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job deleted while its watch event is still on the way: the loop ends, nothing is left."""

    async def gone(*_: Any) -> None:
        return None

    monkeypatch.setattr(handlers, "reconcile_once", gone)
    state = handlers.OperatorState(RecordingKube(), Metrics())
    memo = kopf.Memo(state=state)

    async def scenario() -> None:
        body = _Body(metadata={"name": "ctr", "namespace": "ns"})
        log = logging.getLogger("test")
        await _kopf_fn(handlers.job_changed)(
            type=None, body=body, namespace="ns", name="ctr", memo=memo, logger=log, node_health={}
        )
        await asyncio.sleep(0.05)
        assert state.loops == {} and state.wakeups == {}

    asyncio.run(scenario())


def test_the_leader_gauge_follows_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """Taking the Lease starts the known jobs' loops and says so in psoperator_leader; losing it
    stops them and says so too."""

    async def idle(*_: Any) -> ReconcilePlan:
        await asyncio.sleep(3600)
        return ReconcilePlan(status={}, render=None)

    monkeypatch.setattr(handlers, "reconcile_once", idle)
    state = handlers.OperatorState(RecordingKube(), Metrics(), known={("ns", "ctr")})

    def leader() -> float | None:
        return state.metrics.registry.get_sample_value("psoperator_leader")

    async def scenario() -> None:
        await handlers._lead(state)
        assert leader() == 1 and ("ns", "ctr") in state.loops
        await handlers._follow(state)
        assert leader() == 0 and not state.loops

    asyncio.run(scenario())


def test_back_off_doubles_up_to_its_limit() -> None:
    assert [handlers.retry_after(n) for n in (1, 2, 3, 6, 7, 50)] == [1.0, 2.0, 4.0, 30.0, 30.0, 30.0]


def test_a_series_of_failed_reconciles_is_logged_once_and_its_end_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An API outage is no log storm: one line when it starts, one when the job reconciles again."""
    outcomes: list[Exception | None] = [ApiException(status=503, reason="Service Unavailable")] * 3 + [None]
    waits: list[float] = []

    async def flaky(*_: Any) -> ReconcilePlan | None:
        outcome = outcomes.pop(0) if outcomes else None
        if outcome is not None:
            raise outcome
        return None if not outcomes else ReconcilePlan(status={}, render=None)

    real_wait_for = asyncio.wait_for

    async def recorded_wait_for(awaitable: Any, timeout: float) -> Any:
        waits.append(timeout)
        return await real_wait_for(awaitable, timeout=0)

    monkeypatch.setattr(handlers, "reconcile_once", flaky)
    monkeypatch.setattr(asyncio, "wait_for", recorded_wait_for)
    state = handlers.OperatorState(RecordingKube(), Metrics())
    logger = logging.getLogger("test.flaky")
    with caplog.at_level(logging.DEBUG, logger="test.flaky"):
        asyncio.run(handlers.run_job(state, "ns", "ctr", logger))
    assert waits == [1.0, 2.0, 4.0]
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "WARNING",
            "reconcile failed: the API server answered 503 Service Unavailable; retrying with back-off",
        ),
        ("DEBUG", "reconcile failed again (2 in a row): the API server answered 503 Service Unavailable"),
        ("DEBUG", "reconcile failed again (3 in a row): the API server answered 503 Service Unavailable"),
        ("INFO", "reconcile succeeded again after 3 failures"),
    ]


def test_an_unexpected_error_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.bug")
    with caplog.at_level(logging.DEBUG, logger="test.bug"):
        try:
            raise KeyError("status")
        except KeyError as error:
            handlers.log_failure(logger, error, 1)
    assert caplog.records[0].levelname == "ERROR" and caplog.records[0].exc_info is not None

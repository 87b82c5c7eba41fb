"""A job's loop (control/loop.py): its pace, its resyncs and timers, the back-off after failed
reconciles and how they are logged."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from psoperator.control import loop
from psoperator.control.state import Config, JobState, OperatorState
from psoperator.metrics.registry import Metrics
from psoperator.plan.stages import ReconcilePlan
from tests.unit.test_kube import RecordingKube

_LOOPING: Any = object()  # stands for a running loop's task


def _looping(jobs: int, idle_from: int | None = None) -> dict[tuple[str, str], JobState]:
    """`jobs` jobs whose loops run, those from `idle_from` on finished or suspended."""
    idle = range(idle_from if idle_from is not None else jobs, jobs)
    return {("ns", f"job-{i}"): JobState(None, loop=_LOOPING, idle=i in idle) for i in range(jobs)}


def test_finished_and_suspended_jobs_resync_rarely_and_every_timer_is_jittered() -> None:
    state = OperatorState(RecordingKube(), Metrics(), Config(resync_seconds=10, idle_resync_seconds=300))

    def waits(phase: str, requeue: float | None = None) -> set[float]:
        plan = ReconcilePlan(status={"phase": phase}, render=None, requeue_after=requeue)
        return {loop.resync_after(state, plan) for _ in range(50)}

    running, succeeded, suspended = waits("Running"), waits("Succeeded"), waits("Suspended")
    assert all(9 <= w <= 11 for w in running) and len(running) > 1
    assert all(270 <= w <= 330 for w in succeeded | suspended) and len(succeeded) > 1
    assert waits("Succeeded", requeue=42) == {42}  # the TTL comes first


def test_with_many_jobs_the_resyncs_stretch_to_the_operators_pace() -> None:
    """1,000 jobs at 20 resyncs a second: each every 50 s, not 10 (a plan's own timer still wins)."""
    state = OperatorState(RecordingKube(), Metrics(), Config(resync_seconds=10, resyncs_per_second=20))
    running = ReconcilePlan(status={"phase": "Running"}, render=None)
    state.jobs = _looping(100)
    assert all(9 <= loop.resync_after(state, running) <= 11 for _ in range(20))
    state.jobs = _looping(1000)
    assert all(45 <= loop.resync_after(state, running) <= 55 for _ in range(20))
    assert loop.resync_after(state, replace(running, requeue_after=3)) == 3


def test_the_pace_is_counted_once_a_second_while_the_number_of_jobs_stays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counting the loops is O(jobs): 1,000 jobs' 20 reconciles a second count them once a second."""
    state = OperatorState(RecordingKube(), Metrics(), Config(resync_seconds=10, resyncs_per_second=20))
    state.jobs = _looping(1000)
    counted = []
    looping = state.looping

    def counting() -> list[JobState]:
        counted.append(1)
        return looping()

    monkeypatch.setattr(state, "looping", counting)
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    assert [loop.pace_stretch(state) for _ in range(20)] == [5.0] * 20 and len(counted) == 1
    clock[0] += loop.PACE_RECOUNT_SECONDS
    state.jobs[("ns", "job-0")].idle = True
    assert loop.pace_stretch(state) < 5.0 and len(counted) == 2
    state.jobs = _looping(500)  # fewer jobs: counted again at once
    assert loop.pace_stretch(state) == 2.5 and len(counted) == 3


def test_a_loop_marks_its_job_idle_while_it_is_finished_and_forgets_it_when_it_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    phases = iter(["Running", "Succeeded"])

    async def reconcile(_state: Any, namespace: str, name: str, _logger: Any) -> ReconcilePlan:
        return ReconcilePlan(status={"phase": next(phases)}, render=None)

    monkeypatch.setattr(loop, "reconcile_once", reconcile)
    state = OperatorState(RecordingKube(), Metrics(), Config(resync_seconds=3600))
    key = ("ns", "ctr")

    async def scenario() -> None:
        loop.start_loop(state, key, logging.getLogger("test"))
        await asyncio.sleep(0.1)
        assert not state.jobs[key].idle
        loop.wake(state, key)
        await asyncio.sleep(0.2)  # past the loop's settling
        assert state.jobs[key].idle
        await loop.stop_loop(state, key)
        assert not state.jobs[key].idle

    asyncio.run(scenario())


def test_a_loop_woken_in_the_turn_its_job_is_deleted_still_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's DELETED stops its loop while the garbage collector's deletions of its children wake
    it: Python 3.11's asyncio.wait_for can return the wake-up and swallow the cancellation; the loop
    must stop all the same, or the DELETED handler waits for it until the job's next fresh read (and
    a deleted job's series are still scraped meanwhile)."""

    reconciles: list[int] = []

    async def reconcile(_state: Any, namespace: str, name: str, _logger: Any) -> ReconcilePlan:
        reconciles.append(len(reconciles) + 1)
        return ReconcilePlan(status={"phase": "Succeeded"}, render=None)

    monkeypatch.setattr(loop, "reconcile_once", reconcile)
    state = OperatorState(RecordingKube(), Metrics(), Config(resync_seconds=3600))
    key = ("ns", "ctr")

    async def scenario() -> None:
        loop.start_loop(state, key, logging.getLogger("test"))
        await asyncio.sleep(0.1)  # waiting for its next resync
        loop.wake(state, key)  # in the same turn as the cancellation
        stopping = asyncio.create_task(loop.stop_loop(state, key))
        done, _ = await asyncio.wait({stopping}, timeout=2)
        task = state.jobs[key].loop
        if task is not None:  # it went on: stop it for good before failing
            task.cancel()
            await asyncio.wait({stopping})
        assert done and task is None and reconciles == [1]

    asyncio.run(scenario())


def test_finished_jobs_count_in_the_pace_at_their_own_rare_resync() -> None:
    """100 running jobs beside 900 finished ones keep their 10 s resync (the finished ones cost 3
    reconciles a second, not 90); 10,000 finished ones stretch everything, theirs too."""
    state = OperatorState(
        RecordingKube(), Metrics(), Config(resync_seconds=10, resyncs_per_second=20, idle_resync_seconds=300)
    )
    running = ReconcilePlan(status={"phase": "Running"}, render=None)
    succeeded = ReconcilePlan(status={"phase": "Succeeded"}, render=None)
    state.jobs = _looping(1000, idle_from=100)
    assert all(9 <= loop.resync_after(state, running) <= 11 for _ in range(20))
    state.jobs = _looping(10_100, idle_from=100)
    stretch = (100 / 10 + 10_000 / 300) / 20  # 2.17
    assert all(9 * stretch <= loop.resync_after(state, running) <= 11 * stretch for _ in range(20))
    assert all(270 * stretch <= loop.resync_after(state, succeeded) <= 330 * stretch for _ in range(20))


def _drawing_the(end: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """random.uniform draws the `end` ("low" or "high") of its range."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low if end == "low" else high)


def test_back_off_draws_within_a_span_that_doubles_up_to_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full jitter: anywhere from 0 to the span; the span of an outage of days is still RETRY_MAX."""
    failures = (1, 2, 3, 6, 7, 50, 10_000)
    _drawing_the("high", monkeypatch)
    assert [loop.retry_after(n) for n in failures] == [1.0, 2.0, 4.0, 30.0, 30.0, 30.0, 30.0]
    _drawing_the("low", monkeypatch)
    assert {loop.retry_after(n) for n in failures} == {0.0}


def test_jobs_failed_together_retry_spread_over_the_span_not_in_lockstep() -> None:
    """1,000 jobs whose reconciles an API outage failed at once: their retries spread over the
    span, about as many in each tenth of it."""
    waits = [loop.retry_after(5) for _ in range(1000)]
    assert all(0 <= w <= loop.RETRY_FIRST * 16 for w in waits)
    tenths = Counter(int(w / (loop.RETRY_FIRST * 1.6)) for w in waits)
    assert len(tenths) == 10 and min(tenths.values()) > 50, tenths


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

    real_timeout = asyncio.timeout

    def recorded_timeout(delay: float) -> asyncio.Timeout:
        waits.append(delay)
        return real_timeout(0)

    monkeypatch.setattr(loop, "reconcile_once", flaky)
    monkeypatch.setattr(asyncio, "timeout", recorded_timeout)
    _drawing_the("high", monkeypatch)
    state = OperatorState(RecordingKube(), Metrics())
    logger = logging.getLogger("test.flaky")
    with caplog.at_level(logging.DEBUG, logger="test.flaky"):
        asyncio.run(loop.run_job(state, "ns", "ctr", logger))
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
            loop.log_failure(logger, error, 1)
    assert caplog.records[0].levelname == "ERROR" and caplog.records[0].exc_info is not None

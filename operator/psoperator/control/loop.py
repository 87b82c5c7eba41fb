"""One loop per job, and its pace.

A job's loop reconciles it (control/reconciler.py) on start (including after an operator restart),
when the watches wake it (its spec or one of its children changed; not its status: the operator
writes it), and on a timer for progress, deadlines and TTLs: finished and suspended jobs rarely,
every timer jittered, all of them stretched when the jobs together would pass `resyncs_per_second`.
A reconcile that did not go through is retried after a back-off with full jitter (a random wait up
to a span that doubles with each failure in a row), so that jobs failed together by an API outage
do not come back together: after an error the job's full read is due, and comes at its turn
(OperatorState.may_read_periodically), not at once; after a refused status write (409: the job
changed since it was read) the job is read fresh before the status is written again. The loop ends
when the job is gone, forgetting it, or when it is cancelled (the job deleted, the operator
stopping).

The loops are the operator's own tasks, started and stopped by the job's watch events, not kopf
daemons: kopf puts a finalizer on every object that has a daemon, and a job with a finalizer cannot
be deleted while the operator is stopped (its namespace then stays Terminating). Nothing needs one:
the children go with the job through their owner references, and the loop forgets the job when
the watch says it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from typing import Any

from psoperator.api.vocabulary import FINISHED_PHASES, Phase
from psoperator.control.reconciler import reconcile_once
from psoperator.control.state import OperatorState
from psoperator.kube import StaleJob, api_failure
from psoperator.observe.cache import JobKey
from psoperator.plan.draft import ReconcilePlan

# After a reconcile that did not go through, the span of the wait before the next: RETRY_FIRST,
# doubling with each one in a row up to RETRY_MAX.
RETRY_FIRST, RETRY_MAX = 1.0, 30.0
# Timers are spread by this fraction either way, so jobs started together do not stay aligned.
JITTER = 0.1
# The jobs' loops are counted for the pace at most this often while their number stays: counting is
# O(jobs), and at 1,000 jobs each of 20 reconciles a second would pay it (more than a standing one).
PACE_RECOUNT_SECONDS = 1.0
# A woken loop waits this long for the rest of a burst of events of the job's objects.
SETTLE_SECONDS = 0.05


def wake(state: OperatorState, key: JobKey | None) -> None:
    """Wake the job's loop. Only from the event loop's thread: asyncio.Event is not thread-safe, so
    every handler that wakes is async (kopf runs sync handlers in executor threads)."""
    job = state.jobs.get(key) if key is not None else None
    if job is not None and job.wakeup is not None:
        job.wakeup.set()


def start_loop(state: OperatorState, key: JobKey, logger: Any) -> bool:
    """Start the job's loop (in a copy of `state.context`) unless it runs; True when this started it."""
    job = state.job(key, logger)
    if job.loop is not None:
        return False
    job.wakeup = asyncio.Event()
    context = state.context.copy() if state.context is not None else None
    job.loop = asyncio.create_task(run_job(state, *key, logger), name="/".join(key), context=context)
    return True


async def stop_loop(state: OperatorState, key: JobKey) -> None:
    """Cancel the job's loop and wait for it: its clean-up (wake-up, metrics) runs before this returns."""
    job = state.jobs.get(key)
    loop = job.loop if job is not None else None
    if loop is not None:
        loop.cancel()
        try:
            await loop
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if caller is not None and caller.cancelling():
                raise  # the caller is cancelled itself, not only the loop
        # A loop cancelled before it ever ran did not clean up after itself.
        drop_loop(state, key, loop)


def drop_loop(state: OperatorState, key: JobKey, loop: asyncio.Task[None] | None) -> None:
    """The job's loop is over: it is let go (unless a newer one took its place), and its series."""
    job = state.jobs.get(key)
    if job is not None and job.loop is loop:
        job.loop, job.wakeup, job.idle = None, None, False
    state.metrics.forget(*key)  # a deleted job leaves no series behind
    state.metrics.jobs_managed.set(len(state.looping()))


def lead(state: OperatorState) -> None:
    """This replica took the Lease: every job it knows gets its loop (a restart was perhaps half done).
    On the event loop's thread. A replica that loses the Lease exits (control/leader.py)."""
    state.metrics.leader.set(1)
    for key in sorted(state.jobs):
        start_loop(state, key, state.jobs[key].logger)


async def stop_loops(state: OperatorState) -> None:
    for key in [key for key, job in state.jobs.items() if job.loop is not None]:
        await stop_loop(state, key)


def is_idle(plan: ReconcilePlan | None) -> bool:
    return plan is not None and plan.status.get("phase") in (*FINISHED_PHASES, Phase.SUSPENDED)


def pace_stretch(state: OperatorState) -> float:
    """How much every resync stretches so that all jobs' together stay within resyncs_per_second;
    counted again when the number of jobs changed or PACE_RECOUNT_SECONDS passed."""
    now, (jobs, counted_at, stretch) = time.monotonic(), state.pace
    if jobs == len(state.jobs) and now - counted_at < PACE_RECOUNT_SECONDS:
        return stretch
    looping = state.looping()
    idle = sum(1 for job in looping if job.idle)
    config = state.config
    wanted = (len(looping) - idle) / config.resync_seconds + idle / config.idle_resync_seconds
    stretch = max(1.0, wanted / config.resyncs_per_second)
    state.pace = (len(state.jobs), now, stretch)
    return stretch


def resync_after(state: OperatorState, plan: ReconcilePlan | None) -> float:
    """When to look at the job again unwoken: soon while it runs, rarely once it has finished or is
    suspended (both later when there are so many jobs that resyncs_per_second would be passed),
    sooner when the plan asks (a TTL, a deadline, an old chief stopping); jittered."""
    base = state.config.idle_resync_seconds if is_idle(plan) else state.config.resync_seconds
    wait = base * pace_stretch(state) * random.uniform(1 - JITTER, 1 + JITTER)
    if plan is not None and plan.requeue_after is not None:
        wait = min(wait, max(plan.requeue_after, 0.5))
    return wait


def retry_after(failures: int) -> float:
    """Seconds before the next reconcile after `failures` ones in a row that did not go through: a
    random point of the back-off's span (full jitter)."""
    span = min(RETRY_FIRST * 2 ** min(failures - 1, 32), RETRY_MAX)
    return random.uniform(0, span)


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
    """Reconcile the job until it is gone (then it is forgotten) or its loop is cancelled."""
    key = (namespace, name)
    job = state.job(key, logger)
    wakeup = job.wakeup = job.wakeup or asyncio.Event()
    state.metrics.jobs_managed.set(len(state.looping()))
    failures = conflicts = 0  # in a row: failed reconciles; status writes refused as stale
    try:
        while True:
            wakeup.clear()
            started = time.monotonic()
            try:
                plan = await reconcile_once(state, namespace, name, logger)
                state.metrics.reconciled("ok", time.monotonic() - started)
                job.idle = is_idle(plan)
                wait = resync_after(state, plan)
            except StaleJob as stale:  # another writer got there first: read it before writing again
                conflicts += 1
                logger.info("%s; reconciling it again", stale)
                job.stale = True
                plan, wait = None, retry_after(conflicts)
            except Exception as error:  # one bad reconcile must not end the job's loop
                failures += 1
                log_failure(logger, error, failures)
                state.metrics.reconciled("error", time.monotonic() - started)
                plan, wait = None, retry_after(failures)
                job.read_at = -math.inf  # its full read is due, at its turn
            else:
                if failures:
                    logger.info("reconcile succeeded again after %d failures", failures)
                failures = conflicts = 0
                if plan is None:  # gone or being deleted, even if its watch event is still to come
                    state.forget(key)
                    return
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns a wake-up that comes in
            # the turn the loop is cancelled and drops the cancellation (the loop went on).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await wakeup.wait()
            await asyncio.sleep(SETTLE_SECONDS)
    finally:
        drop_loop(state, key, asyncio.current_task())

"""The chief's progress report: from its termination message once it ended, else from its progress
port, and when to ask that port again after nothing answered there.

A plain TensorFlow image never serves /progress: asking it at every reconcile costs a connection
attempt each time (a third of a quiet reconcile's CPU, measured with py-spy at 1,000 jobs); a hung
runtime that takes the connection and never answers costs the whole timeout (2 s) each time, the
reconcile about to restart that chief included. So a chief pod that refused or did not answer in
time (a "refusal" below) is asked again only after a wait that doubles with each refusal, from
FIRST_WAIT_SECONDS up to MAX_WAIT_SECONDS. A runtime that starts its endpoint late is seen late by
at most about as long as it took to start it; any answer, even a garbled one, ends the back-off.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp

from psoperator.contract import PROGRESS_PATH, ProgressReport
from psoperator.observe.views import PodView

FIRST_WAIT_SECONDS = 5.0
MAX_WAIT_SECONDS = 300.0


@dataclass(frozen=True)
class Refusals:
    """A chief pod's refusals in a row, and until when (monotonic seconds) it is not asked."""

    pod_uid: str
    count: int
    until: float


def due(refusals: Refusals | None, pod_uid: str, now: float) -> bool:
    """Whether to ask this chief pod now: always, unless it refused and its wait runs."""
    return refusals is None or refusals.pod_uid != pod_uid or now >= refusals.until


def refused(previous: Refusals | None, pod_uid: str, now: float) -> Refusals:
    """The refusals after one more; a new chief pod starts from the first wait."""
    count = previous.count + 1 if previous is not None and previous.pod_uid == pod_uid else 1
    wait = min(FIRST_WAIT_SECONDS * 2 ** (count - 1), MAX_WAIT_SECONDS)
    return Refusals(pod_uid, count, now + wait)


class NotServing(Exception):
    """Nothing serves the chief's progress port: no connection, or no answer in time."""


async def fetch_progress(
    session: aiohttp.ClientSession, pod_ip: str, port: int, timeout: float = 2.0
) -> ProgressReport | None:
    """The chief's progress report; None when it cannot be had or makes no sense. Raises NotServing
    when nothing takes the connection (refused, no route) or nothing answers within `timeout` (a
    hung runtime): either way, asking at every reconcile would cost each one as much."""
    url = f"http://{pod_ip}:{port}{PROGRESS_PATH}"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if response.status != 200:
                return None
            return ProgressReport.parse(await response.read())
    except (aiohttp.ClientConnectorError, TimeoutError) as error:
        raise NotServing(url) from error
    except (aiohttp.ClientError, OSError):
        return None


async def chief_report(
    session: aiohttp.ClientSession | None, port: int, chief: PodView | None, refusals: Refusals | None
) -> tuple[ProgressReport | None, Refusals | None]:
    """The chief's report (its termination message once it ended, else from its progress port
    unless the port refused or did not answer lately), and the refusals in a row after this."""
    if chief is None:
        return None, refusals
    if chief.terminated is not None:  # the runtime's last word, as its termination message
        return ProgressReport.parse(chief.terminated.message), refusals
    if not (chief.running and chief.ip and session is not None):
        return None, refusals
    now = time.monotonic()
    if not due(refusals, chief.uid, now):
        return None, refusals
    try:
        return await fetch_progress(session, chief.ip, port), None
    except NotServing:
        return None, refused(refusals, chief.uid, now)

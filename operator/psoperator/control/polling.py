"""The chief's progress report: from its termination message once it ended, else from its progress
port, and when to ask that port again after nothing answered there.

A plain TensorFlow image never serves /progress: asking it at every reconcile costs a connection
attempt each time (a third of a quiet reconcile's CPU, measured with py-spy at 1,000 jobs); a hung
runtime that takes the connection and never answers costs the whole timeout (2 s) each time, the
reconcile about to restart that chief included. So a chief pod that refused or did not answer in
time (a "refusal" below) is asked again only after a wait that doubles with each refusal, from
FIRST_WAIT_SECONDS up to MAX_WAIT_SECONDS. A runtime that starts its endpoint late is seen late by
at most about as long as it took to start it; any answer, even a garbled one, ends the back-off.

A report with a value the job's status cannot keep (contract.ProgressReport.read) is rejected,
naming the pod and where it came from, and the job is decided without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import aiohttp

from psoperator.contract import (
    CHECKPOINT_PATH,
    PROGRESS_PATH,
    CheckpointAnswer,
    ProgressReport,
    RejectedReport,
)
from psoperator.observe.views import PodView
from psoperator.policies.planned_stop import CheckpointAsk, CheckpointOutcome

FIRST_WAIT_SECONDS = 5.0
MAX_WAIT_SECONDS = 300.0
# The most of an answer of the progress port that is read: a report is a few hundred bytes.
MAX_REPORT_BYTES = 64 * 1024


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
) -> ProgressReport | RejectedReport | None:
    """The chief's progress report; None when it cannot be had or is no report, rejected when it
    is no valid one (ProgressReport.read) or longer than MAX_REPORT_BYTES. Raises NotServing when
    nothing takes the connection (refused, no route) or nothing answers within `timeout` (a hung
    runtime): either way, asking at every reconcile would cost each one as much."""
    url = f"http://{pod_ip}:{port}{PROGRESS_PATH}"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            if response.status != 200:
                return None
            body = b""  # up to one byte past the limit, which is enough to tell it was passed
            while len(body) <= MAX_REPORT_BYTES:
                chunk = await response.content.read(MAX_REPORT_BYTES + 1 - len(body))
                if not chunk:  # the end
                    break
                body += chunk
    except (aiohttp.ClientConnectorError, TimeoutError) as error:
        raise NotServing(url) from error
    except (aiohttp.ClientError, OSError):
        return None
    if len(body) > MAX_REPORT_BYTES:
        return RejectedReport(f"longer than {MAX_REPORT_BYTES} bytes")
    return ProgressReport.read(body)


async def chief_report(
    session: aiohttp.ClientSession | None, port: int, chief: PodView | None, refusals: Refusals | None
) -> tuple[ProgressReport | RejectedReport | None, Refusals | None]:
    """The chief's report (its termination message once it ended, else from its progress port
    unless the port refused or did not answer lately), and the refusals in a row after this. A
    rejected report names the pod and where it came from."""
    if chief is None:
        return None, refusals
    if chief.terminated is not None:  # the runtime's last word, as its termination message
        report = ProgressReport.read(chief.terminated.message)
        return _from(report, f"the termination message of pod {chief.name}"), refusals
    if not (chief.running and chief.ip and session is not None):
        return None, refusals
    now = time.monotonic()
    if not due(refusals, chief.uid, now):
        return None, refusals
    try:
        report = await fetch_progress(session, chief.ip, port)
    except NotServing:
        return None, refused(refusals, chief.uid, now)
    return _from(report, f"the progress report of pod {chief.name}"), None


def _from(
    report: ProgressReport | RejectedReport | None, source: str
) -> ProgressReport | RejectedReport | None:
    if isinstance(report, RejectedReport):
        return RejectedReport(f"{source} is ignored: {report.reason}")
    return report


# What the answer may take beyond the ask's deadline: the chief answers at its deadline at the latest.
ANSWER_MARGIN_SECONDS = 5.0


async def ask_checkpoint(
    session: aiohttp.ClientSession | None, port: int, ask: CheckpointAsk, refusals: Refusals | None
) -> CheckpointOutcome:
    """POST the checkpoint request to the chief and wait for its answer, up to the ask's deadline.
    A chief whose progress port refused lately (a plain TensorFlow image) is not asked."""
    if session is None or (refusals is not None and refusals.pod_uid == ask.chief_uid):
        why = "the chief does not serve its progress port (no checkpoint on demand in its image)"
        return _outcome(ask, None, why)
    url = f"http://{ask.chief_ip}:{port}{CHECKPOINT_PATH}"
    body = {"deadlineSeconds": ask.deadline_seconds, "holdSeconds": ask.hold_seconds}
    timeout = aiohttp.ClientTimeout(total=ask.deadline_seconds + ANSWER_MARGIN_SECONDS)
    try:
        async with session.post(url, json=body, timeout=timeout) as response:
            status, text = response.status, await response.read()
    except TimeoutError:
        return _outcome(ask, None, f"the chief did not answer within {ask.deadline_seconds:g}s")
    except (aiohttp.ClientError, OSError) as error:
        return _outcome(ask, None, f"the chief could not be asked: {error}")
    answer = CheckpointAnswer.parse(text)
    if answer is None:
        return _outcome(ask, status, f"the chief answered HTTP {status} without a checkpoint answer")
    return CheckpointOutcome(ask, status, answer, datetime.now(UTC))


def _outcome(ask: CheckpointAsk, status: int | None, reason: str) -> CheckpointOutcome:
    return CheckpointOutcome(ask, status, CheckpointAnswer(reason=reason), datetime.now(UTC))

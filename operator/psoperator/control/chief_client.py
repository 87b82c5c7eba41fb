"""The chief's progress report: from its termination message once it ended, else from its progress
port, and when to ask that port again after nothing answered there.

A plain TensorFlow image never serves /progress: asking it at every reconcile costs a connection
attempt each time (much of a quiet reconcile's CPU); a hung
runtime that takes the connection and never answers costs the whole timeout (2 s) each time, the
reconcile about to restart that chief included. So a chief pod that refused or did not answer in
time (a "refusal" below) is asked again only after a wait that doubles with each refusal, from
FIRST_WAIT_SECONDS up to MAX_WAIT_SECONDS. A runtime that starts its endpoint late is seen late by
at most about as long as it took to start it; any answer, even a garbled one, ends the back-off.

A report with a value the job's status cannot keep (contract.ProgressReport.read) is rejected,
naming the pod and where it came from, and the job is decided without it.

Every request carries the job's chief token (control/chief_key.py), without which a chief that has
one answers 401: no report, no checkpoint. A chief runs a tenant's code, so its answers are
untrusted: a redirect is not followed (it would have the operator read, or post a hold to, any
address the operator's namespace reaches: another job's chief), an answer longer than
MAX_ANSWER_BYTES is garbled and read no further (one chief must not fill the operator's memory,
which every job shares), and nothing is decompressed or kept between chiefs (chief_session).
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
# A report or a checkpoint answer is a few hundred bytes (a termination message holds 4 KiB at most).
MAX_ANSWER_BYTES = 64 * 1024


def chief_session() -> aiohttp.ClientSession:
    """The session chiefs are asked with: no cookie kept (one chief would set it for the others),
    no compression (a small gzip body inflates past MAX_ANSWER_BYTES before it is counted)."""
    return aiohttp.ClientSession(
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        headers={"Accept-Encoding": "identity"},
    )


async def bounded_body(response: aiohttp.ClientResponse) -> bytes | None:
    """The answer's body; None (read no further) when it is longer than MAX_ANSWER_BYTES."""
    if (response.content_length or 0) > MAX_ANSWER_BYTES:
        return None
    body = bytearray()
    async for chunk in response.content.iter_chunked(MAX_ANSWER_BYTES):
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            return None
    return bytes(body)


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


def _authorization(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def fetch_progress(
    session: aiohttp.ClientSession, pod_ip: str, port: int, token: str | None, timeout: float = 2.0
) -> ProgressReport | RejectedReport | None:
    """The chief's progress report; None when it cannot be had or is no report (a redirect
    included), rejected when it is no valid one (ProgressReport.read) or longer than
    MAX_ANSWER_BYTES. Raises NotServing when nothing takes the connection (refused, no route) or
    nothing answers within `timeout` (a hung runtime): either way, asking at every reconcile would
    cost each one as much."""
    url = f"http://{pod_ip}:{port}{PROGRESS_PATH}"
    limit = aiohttp.ClientTimeout(total=timeout)
    try:
        headers = _authorization(token)
        async with session.get(url, timeout=limit, allow_redirects=False, headers=headers) as response:
            if response.status != 200:
                return None
            body = await bounded_body(response)
    except (aiohttp.ClientConnectorError, TimeoutError) as error:
        raise NotServing(url) from error
    except (aiohttp.ClientError, OSError):
        return None
    if body is None:
        return RejectedReport(f"longer than {MAX_ANSWER_BYTES} bytes")
    return ProgressReport.read(body)


async def chief_report(
    session: aiohttp.ClientSession | None,
    port: int,
    chief: PodView | None,
    refusals: Refusals | None,
    token: str | None,
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
        report = await fetch_progress(session, chief.ip, port, token)
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
    session: aiohttp.ClientSession | None,
    port: int,
    ask: CheckpointAsk,
    refusals: Refusals | None,
    token: str | None,
) -> CheckpointOutcome:
    """POST the checkpoint request to the chief and wait for its answer, up to the ask's deadline.
    A chief whose progress port refused lately is asked only if the port answers now (a runtime
    that was still starting); one that still does not serve it (a plain TensorFlow image, or a hung
    runtime) is not asked, and the stop does not wait for it."""
    why = "the chief does not serve its progress port (no checkpoint on demand in its image)"
    if session is None:
        return _outcome(ask, None, why)
    if refusals is not None and refusals.pod_uid == ask.chief_uid:
        try:
            await fetch_progress(session, ask.chief_ip, port, token)
        except NotServing:
            return _outcome(ask, None, why)
    url = f"http://{ask.chief_ip}:{port}{CHECKPOINT_PATH}"
    body = {"deadlineSeconds": ask.deadline_seconds, "holdSeconds": ask.hold_seconds}
    timeout = aiohttp.ClientTimeout(total=ask.deadline_seconds + ANSWER_MARGIN_SECONDS)
    try:
        headers = _authorization(token)
        posted = session.post(url, json=body, timeout=timeout, allow_redirects=False, headers=headers)
        async with posted as response:
            status, text = response.status, await bounded_body(response)
    except TimeoutError:
        return _outcome(ask, None, f"the chief did not answer within {ask.deadline_seconds:g}s")
    except (aiohttp.ClientError, OSError) as error:
        return _outcome(ask, None, f"the chief could not be asked: {error}")
    if 300 <= status < 400:
        return _outcome(ask, status, f"the chief answered HTTP {status}, a redirect, which is not followed")
    if text is None:
        return _outcome(ask, status, f"the chief's answer (HTTP {status}) is over {MAX_ANSWER_BYTES} bytes")
    answer = CheckpointAnswer.parse(text)
    if answer is None:
        return _outcome(ask, status, f"the chief answered HTTP {status} without a checkpoint answer")
    return CheckpointOutcome(ask, status, answer, datetime.now(UTC))


def _outcome(ask: CheckpointAsk, status: int | None, reason: str) -> CheckpointOutcome:
    return CheckpointOutcome(ask, status, CheckpointAnswer(reason=reason), datetime.now(UTC))

"""When to ask a chief for its progress again after nothing answered at its progress port.

A plain TensorFlow image never serves /progress: asking it at every reconcile costs a connection
attempt each time (a third of a quiet reconcile's CPU, measured with py-spy at 1,000 jobs); a hung
runtime that takes the connection and never answers costs the whole timeout (2 s) each time, the
reconcile about to restart that chief included. So a chief pod that refused or did not answer in
time (a "refusal" below) is asked again only after a wait that doubles with each refusal, from
FIRST_WAIT_SECONDS up to MAX_WAIT_SECONDS. A runtime that starts its endpoint late is seen late by
at most about as long as it took to start it; any answer, even a garbled one, ends the back-off.
"""

from __future__ import annotations

from dataclasses import dataclass

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

"""A reconcile that changed nothing stands while nothing it was decided from changes.

At rest (a job running, its pods up, nothing to do), a resync would decide again from the same
inputs: the plan (the spec and status validated by pydantic, every stage), the metrics' reading of
it (three more validations) and a status patch of nothing. A decision that wrote nothing
and acted on nothing is kept with what it was decided from (`inputs_of`) until its own clock asks for
another (`ReconcilePlan.requeue_after`: every clock of the plan asks for one, from the TTL to the
stall timeout, plan/stages.py; and the moment the metrics would read the step rate as 0); a
reconcile that finds the same inputs before then returns it without deciding (reconciler.py). A job's
periodic fresh read always decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from psoperator.contract import ProgressReport
from psoperator.metrics.readings import STEP_RATE_IDLE_SECONDS
from psoperator.observe.cache import Snapshot
from psoperator.observe.views import Observed
from psoperator.plan.draft import ReconcilePlan
from psoperator.policies.planned_stop import CheckpointOutcome
from psoperator.timeutil import parse_time


@dataclass(frozen=True)
class Settled:
    """A decision that changed nothing, what it was decided from, and until when it stands."""

    inputs: tuple[Any, ...]
    until: float  # time.monotonic() when its own clock asks for a new decision
    plan: ReconcilePlan

    def stands(self, inputs: tuple[Any, ...] | None, now: float) -> ReconcilePlan | None:
        """The plan, its wake-up counted from `now`, when nothing it was decided from changed."""
        if inputs is None or inputs != self.inputs or now >= self.until:
            return None
        left = None if math.isinf(self.until) else self.until - now
        return replace(self.plan, requeue_after=left)


def inputs_of(
    seen: Snapshot,
    observed: Observed,
    tracked: set[str],
    report: ProgressReport | None,
    outcome: CheckpointOutcome | None,
    kueue_served: bool,
) -> tuple[Any, ...] | None:
    """What a decision is made from besides the clock: every object's version (the job, its children,
    its pods), the nodes under the pods, Kueue's view, the chief's report and checkpoint answer. None
    when a pod of the `tracked` uids is gone: how it ended may come from the watch without changing
    any of these."""
    if tracked - {pod.uid for pod in observed.pods}:
        return None
    children = sorted(
        (c["kind"], c["metadata"]["name"], c["metadata"].get("resourceVersion")) for c in seen.children
    )
    return (
        seen.job["metadata"].get("resourceVersion"),
        tuple(children),
        tuple(sorted((pod.uid, pod.version) for pod in observed.pods)),
        tuple(sorted(observed.nodes.items())),
        observed.kueue,
        kueue_served,
        report,
        outcome,
    )


def settle(
    plan: ReconcilePlan, status: dict[str, Any], inputs: tuple[Any, ...] | None, now: float, clock: datetime
) -> Settled | None:
    """The record of a decision that changed nothing (decided at `now`, monotonic; `clock`, the
    plan's wall time); None when it cannot stand: its inputs could not be told, or it waits for pods
    to go (a DELETED the watch may never send: reconciler.py reads fresh when that wait lasts). It
    keeps the job's `status` as read, the one the watch cache holds, for its plan's own equal copy."""
    if inputs is None or plan.awaits_departure:
        return None
    waits = [plan.requeue_after, _step_rate_idle_in(status, clock)]
    left = min((w for w in waits if w is not None), default=math.inf)
    return Settled(inputs, now + left, replace(plan, status=status))


def _step_rate_idle_in(status: dict[str, Any], clock: datetime) -> float | None:
    """Seconds until the metrics read a step that has not moved as a rate of 0 (readings.step_rate)."""
    moved = parse_time(status.get("stepTime"))
    if moved is None:
        return None
    left = STEP_RATE_IDLE_SECONDS - (clock - moved).total_seconds()
    return left if left > 0 else None

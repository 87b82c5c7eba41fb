"""What a reconcile reads of Kueue for a job labelled with a queue (policies/queueing.py): whether
the Workload API is served (asked again every minute while it is not), the job's
WorkloadPriorityClass when its Workload is to be made, and the flavors of an admission not yet
recorded in its status."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from psoperator.api.labels import LABEL_PRIORITY_CLASS
from psoperator.api.vocabulary import Phase
from psoperator.control.state import OperatorState
from psoperator.kube import in_thread
from psoperator.observe.views import Observed
from psoperator.observe.workload import KueueView
from psoperator.policies import queueing
from psoperator.render.workload import GROUP, VERSION

Obj = dict[str, Any]
SERVED_CHECK_SECONDS = 60.0


async def served(state: OperatorState) -> bool:
    """Whether the API server serves Kueue's Workloads; once it does, it is not asked again (a
    discovery that fails counts as not served, until the next time it is asked)."""
    now = time.monotonic()
    if not state.config.kueue:
        return False
    if not state.kueue_served and now - state.kueue_checked_at >= SERVED_CHECK_SECONDS:
        state.kueue_checked_at = now
        with contextlib.suppress(ApiException, urllib3.exceptions.HTTPError):
            state.kueue_served = "workloads" in await in_thread(state.kube.served, GROUP, VERSION)
    return state.kueue_served


async def lists_workloads(state: OperatorState, job: Obj) -> bool:
    """Whether a fresh read lists the job's Workloads: Kueue is served, and the job is labelled
    with a queue or was queued (its label removed since: its Workload is to be deleted). Only
    such a job asks the API server whether Kueue is served."""
    status = job.get("status") or {}
    queued = queueing.queue_of(job["metadata"].get("labels")) is not None
    was_queued = status.get("admission") is not None or status.get("phase") == Phase.QUEUED
    return await served(state) if queued or was_queued else state.kueue_served


async def kueue_view(state: OperatorState, job: Obj, observed: Observed) -> KueueView | None:
    """None for a job with no queue label."""
    labels = job["metadata"].get("labels") or {}
    if queueing.queue_of(labels) is None:
        return None
    if not await served(state):
        return KueueView(served=False)
    priority = None
    priority_class = labels.get(LABEL_PRIORITY_CLASS)
    if priority_class and observed.workload is None:
        found = await in_thread(state.kube.get_kueue_object, "workloadpriorityclasses", priority_class)
        priority = (priority_class, int(found.get("value") or 0)) if found else None
    return KueueView(served=True, priority=priority, flavors=await _flavors(state, job, observed))


async def _flavors(state: OperatorState, job: Obj, observed: Observed) -> dict[str, Obj]:
    """The specs of the admitted Workload's flavors, while its admission is not recorded yet."""
    workload = observed.workload
    recorded = ((job.get("status") or {}).get("admission") or {}).get("workload")
    if workload is None or not workload.admitted or recorded == workload.name:
        return {}
    names = sorted({f for a in workload.assignments for f in (a.get("flavors") or {}).values()})
    flavors = {}
    for name in names:
        found = await in_thread(state.kube.get_kueue_object, "resourceflavors", name)
        flavors[name] = (found or {}).get("spec") or {}
    return flavors

"""Pods on a lost node: force-deleted after failurePolicy.nodeLostTimeoutSeconds.

A pod whose node stopped reporting stays Running (or Terminating) in the API for ever: the Job
controller's podReplacementPolicy Failed waits for a terminal phase that never comes, and a
StatefulSet does not replace a pod it cannot see gone. The pod GC and the StatefulSet docs advise
a force deletion for this case; the operator does it for its own pods, after a bounded time, and
the recovery policy records NodeLost (a disruption, not counted).

The nodes come from a watch (kopf's index of every node's Ready condition), so a reconcile reads
no node from the API.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from psoperator.api.models import PSTrainingJobSpec
from psoperator.observe.views import Observed, PodView
from psoperator.timeutil import parse_time


def nodes_of(observed: Observed) -> set[str]:
    """The nodes of the pods that have not ended: the ones a pod may be stranded on."""
    return {p.node for p in observed.pods if p.node is not None and p.phase not in ("Succeeded", "Failed")}


def lost_pods(
    spec: PSTrainingJobSpec, observed: Observed, now: datetime
) -> tuple[list[PodView], float | None]:
    """The pods to force-delete (each with `node_lost` saying why), and the seconds until the next
    pod would be due (None: none waits)."""
    timeout = spec.failure_policy.node_lost_timeout_seconds
    lost: list[PodView] = []
    due: list[float] = []
    for pod in observed.pods:
        if pod.node is None or pod.node not in observed.nodes or pod.phase in ("Succeeded", "Failed"):
            continue
        node = observed.nodes[pod.node]
        if node is None:
            lost.append(_lost(pod, f"node {pod.node} no longer exists"))
            continue
        if node.ready == "True":
            continue
        since = parse_time(node.since)
        down = (now - since).total_seconds() if since is not None else float(timeout)
        if down >= timeout:
            lost.append(_lost(pod, f"node {pod.node} Ready={node.ready} for {int(down)}s"))
        else:
            due.append(timeout - down)
    return lost, min(due, default=None)


def _lost(pod: PodView, why: str) -> PodView:
    return replace(pod, node_lost=f"{why}; the pod was force-deleted")

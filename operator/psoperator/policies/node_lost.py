"""Pods on a lost node: force-deleted after failurePolicy.nodeLostTimeoutSeconds.

A pod whose node stopped reporting stays Running (or Terminating) in the API for ever: the Job
controller's podReplacementPolicy Failed waits for a terminal phase that never comes, and a
StatefulSet does not replace a pod it cannot see gone. The pod GC and the StatefulSet docs advise
a force deletion for this case; the operator does it for its own pods, after a bounded time, and
the recovery policy records NodeLost (a disruption, not counted).

Only the nodes of pods that are not ready are looked at: the node controller marks the pods of a
NotReady node not ready, so healthy jobs cost no node reads.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from psoperator.api import PSTrainingJobSpec
from psoperator.observe import Observed, PodView
from psoperator.timeutil import parse_time


def _may_be_stranded(pod: PodView) -> bool:
    return pod.node is not None and not pod.ready and pod.phase not in ("Succeeded", "Failed")


def suspect_nodes(observed: Observed) -> set[str]:
    """The nodes to read: those of pods that may be stranded on them."""
    return {p.node for p in observed.pods if _may_be_stranded(p) and p.node is not None}


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

"""Pods on a lost node: replaced only once the node is known to be down.

A node that stopped reporting (Ready=Unknown: its kubelet crashed, or a network partition cut it
off) may still run its containers. A chief started in place of one still running there would be a
second coordinator writing the same checkpoint directory, and a PS started in place of one a second
process of one StatefulSet identity. So the operator does what Kubernetes does for a node that
shut down without warning (non-graceful node shutdown, KEP-2268, and the pod garbage collector): it
force-deletes its pods on a node only once the node is fenced, known to run none of them.

| the pod's node                                                | the operator                      |
|---------------------------------------------------------------|-----------------------------------|
| gone (its Node object deleted)                                | force-deletes the pod at once     |
| not Ready, and tainted node.kubernetes.io/out-of-service      | force-deletes the pod at once     |
| not Ready for failurePolicy.nodeLostTimeoutSeconds, unfenced  | leaves it: the NodeLost condition |
|                                                               | says what an admin does           |
| not Ready for less long, or Ready                             | nothing                           |

A force-deleted pod is marked `node_lost`, and the recovery policy records NodeLost (a disruption,
not counted): its StatefulSet or a new chief attempt replaces it. A pod left on a lost node keeps
its place, and its StatefulSet does not replace it; a restart waits for it to go (plan/stages.py:
retire_old_chiefs, recycle_parameter_servers).

The nodes come from a watch (kopf's index of every node), so a reconcile reads no node from the API.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from psoperator.api.models import PSTrainingJobSpec
from psoperator.observe.views import TAINT_OUT_OF_SERVICE, NodeView, Observed, PodView
from psoperator.timeutil import parse_time

# What ends the wait, in the NodeLost condition: what an admin (or a fencing controller) does.
FENCE = (
    "they are replaced only once their node is known to be down: after making sure it is shut "
    f"down, taint it {TAINT_OUT_OF_SERVICE}=nodeshutdown:NoExecute, or delete the Node"
)


@dataclass(frozen=True)
class Stranded:
    """Pods on a node lost for nodeLostTimeoutSeconds that is not fenced: they may still run."""

    node: NodeView
    pods: tuple[str, ...]


@dataclass(frozen=True)
class NodeLoss:
    fenced: list[PodView]  # to force-delete, each with `node_lost` saying why
    stranded: list[Stranded]
    due: float | None  # seconds until the next pod on a node not Ready is stranded (None: none)


def nodes_of(observed: Observed) -> set[str]:
    """The nodes of the pods that have not ended: the ones a pod may be stranded on."""
    return {p.node for p in observed.pods if p.node is not None and p.phase not in ("Succeeded", "Failed")}


def lost_pods(spec: PSTrainingJobSpec, observed: Observed, now: datetime) -> NodeLoss:
    """The pods on fenced nodes (to force-delete), those stranded on lost nodes that are not, and
    when the next pod would be stranded."""
    timeout = spec.failure_policy.node_lost_timeout_seconds
    fenced: list[PodView] = []
    stranded: dict[str, list[str]] = {}
    due: list[float] = []
    for pod in observed.pods:
        if pod.node is None or pod.node not in observed.nodes or pod.phase in ("Succeeded", "Failed"):
            continue
        node = observed.nodes[pod.node]
        if node is None:
            fenced.append(_lost(pod, f"node {pod.node} no longer exists"))
        elif node.ready == "True":
            continue
        elif node.out_of_service:
            fenced.append(_lost(pod, f"node {pod.node} is Ready={node.ready} and out of service"))
        else:
            since = parse_time(node.since)
            down = (now - since).total_seconds() if since is not None else float(timeout)
            if down >= timeout:
                stranded.setdefault(pod.node, []).append(pod.name)
            else:
                due.append(timeout - down)
    nodes = {name: node for name, node in observed.nodes.items() if node is not None}
    waiting = [Stranded(nodes[name], tuple(sorted(pods))) for name, pods in sorted(stranded.items())]
    return NodeLoss(fenced, waiting, min(due, default=None))


def describe(stranded: list[Stranded]) -> str:
    """The NodeLost condition's message: which pods wait on which node, and what ends the wait."""
    nodes = "; ".join(
        f"node {s.node.name} has been Ready={s.node.ready} since {s.node.since or 'unknown'}: "
        f"{', '.join(s.pods)} may still run there"
        for s in stranded
    )
    return f"{nodes}; {FENCE}"


def _lost(pod: PodView, why: str) -> PodView:
    return replace(pod, node_lost=f"{why}; the pod was force-deleted")

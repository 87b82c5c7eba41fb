"""Parameter servers restart with the chief, so a restart never leaves a second model behind.

A parameter server keeps what a chief created on it after that chief is gone: TensorFlow holds a
dead client's remote context until its keep-alive lapses (600 s), and the memory mostly stays with
the process even then. The next chief creates every variable and slot again, so each restart
against surviving parameter servers adds one more copy of their share of the model (a shorter
keep-alive does not help; docs/performance.md, Parameter server memory, shows the growth).

So a coordinated restart restarts every parameter server that served the chief being replaced (a
PS that failed is new already), and the new chief is held until they are gone: it never connects
to one of them. A PS then holds one copy whatever the number of restarts, which is what the sizing
planner plans for. The recycled pods are remembered (status.tracking.recycling) for the whole
attempt and never tracked: a view that no longer shows one is no proof that none will (a watch
that lags can bring one back as it ran, and its going away must not count as a failure). Workers
are kept: they hold no variables.

The new chief also waits until every parameter server of its attempt runs, and so has an
address. A PS's name (its record in the headless Service) exists only from then on, and a lookup
made before is answered "no such name" for a while after (CoreDNS caches the answer, gRPC's
resolver backs off): a chief started earlier can exit with `UnavailableError: errors resolving
...: Temporary failure in name resolution`, a second restart for nothing.
"""

from __future__ import annotations

from psoperator.api.models import TrackedPod, Tracking
from psoperator.contract import Role
from psoperator.observe.views import Observed, PodView
from psoperator.status.tracking import unchanged_since


def serving_previous_chief(tracking: Tracking, observed: Observed) -> dict[str, str]:
    """PS pods (name to uid) that ran with the chief now replaced: unchanged since the last
    reconcile, or being deleted while they still run (a drained PS serves out its drain: the new
    chief must not connect to it)."""
    return {
        p.name: p.uid
        for p in observed.role_pods(Role.PS)
        if not (p.failed or p.node_lost or p.terminated is not None) and _served(tracking, p)
    }


def _served(tracking: Tracking, pod: PodView) -> bool:
    known = tracking.pods.get(pod.name)
    return known is not None and known.uid == pod.uid and (pod.deleting or unchanged_since(known, pod))


def untracked(pods: dict[str, TrackedPod], recycling: dict[str, str]) -> dict[str, TrackedPod]:
    """The tracking without the recycled PS pods: they go away on purpose, and a view that shows one
    again after it was gone (a watch that lags) must not make it a pod to judge."""
    recycled = set(recycling.values())
    return {name: entry for name, entry in pods.items() if entry.uid not in recycled}


def still_there(recycling: dict[str, str], observed: Observed) -> dict[str, str]:
    """The recycled PS pods that still exist: until none does, the new chief waits."""
    present = {p.uid for p in observed.role_pods(Role.PS)}
    return {name: uid for name, uid in recycling.items() if uid in present}


def not_running(replicas: int, observed: Observed) -> list[int]:
    """The PS tasks (by index) that no Running pod of the attempt serves yet (a Running pod has its
    address; a simulated one may show none, so the address itself is not asked for)."""
    served = {p.index for p in observed.running(Role.PS)}
    return [index for index in range(replicas) if index not in served]


def describe(recycling: dict[str, str]) -> str:
    names = ", ".join(sorted(recycling))
    return (
        f"{names} restart with the chief, not for a failure: a parameter server keeps a gone "
        "chief's variables, so the new chief would add a second copy of the model; it starts "
        "when they are gone"
    )

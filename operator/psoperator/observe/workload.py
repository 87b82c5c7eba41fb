"""What a reconcile sees of Kueue for a queued job: its Workload, and what it read of Kueue's objects
(whether the Workload API is served, the job's WorkloadPriorityClass, the admitted flavors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class WorkloadView:
    name: str
    resource_version: str
    conditions: tuple[Obj, ...] = ()
    cluster_queue: str | None = None  # of its admission
    assignments: tuple[Obj, ...] = ()  # status.admission.podSetAssignments
    # Admission checks' podSetUpdates, by pod set name (labels, annotations, nodeSelector, tolerations).
    updates: tuple[Obj, ...] = ()

    def condition(self, type_: str) -> Obj | None:
        return next((c for c in self.conditions if c.get("type") == type_), None)

    def true(self, type_: str) -> bool:
        found = self.condition(type_)
        return found is not None and found.get("status") == "True"

    @property
    def admitted(self) -> bool:
        """Admitted, and not being taken back (an eviction keeps the admission until the job stops)."""
        return self.true("Admitted") and self.true("QuotaReserved") and not self.true("Evicted")

    @property
    def finished(self) -> bool:
        return self.true("Finished")


def parse_workload(obj: Obj) -> WorkloadView:
    meta, status = obj["metadata"], obj.get("status") or {}
    admission = status.get("admission") or {}
    updates = [u for check in status.get("admissionChecks") or [] for u in check.get("podSetUpdates") or []]
    return WorkloadView(
        name=meta["name"],
        resource_version=meta.get("resourceVersion", ""),
        conditions=tuple(status.get("conditions") or []),
        cluster_queue=admission.get("clusterQueue"),
        assignments=tuple(admission.get("podSetAssignments") or []),
        updates=tuple(updates),
    )


@dataclass(frozen=True)
class KueueView:
    """What the protocol read of Kueue for a job labelled with a queue."""

    served: bool  # the API server serves Kueue's Workload API
    priority: tuple[str, int] | None = None  # the job's WorkloadPriorityClass and its value
    # The spec of each ResourceFlavor its admitted Workload names (nodeLabels, tolerations).
    flavors: dict[str, Obj] = field(default_factory=dict)

"""What a reconcile sees of Kueue for a queued job: its Workload, and what it read of Kueue's objects
(whether the Workload API is served, the job's WorkloadPriorityClass, the admitted flavors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from psoperator.fields import dict_of, list_of, str_of

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
    """The Workload as the policy reads it; a field of an odd type reads as missing, a condition
    without a type is left out."""
    meta, status = dict_of(obj.get("metadata")), dict_of(obj.get("status"))
    admission = dict_of(status.get("admission"))
    checks = (dict_of(check) for check in list_of(status.get("admissionChecks")))
    updates = [u for check in checks for u in list_of(check.get("podSetUpdates")) if isinstance(u, dict)]
    return WorkloadView(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        conditions=tuple(
            c for c in list_of(status.get("conditions")) if isinstance(dict_of(c).get("type"), str)
        ),
        cluster_queue=str_of(admission.get("clusterQueue")),
        assignments=tuple(a for a in list_of(admission.get("podSetAssignments")) if isinstance(a, dict)),
        updates=tuple(updates),
    )


@dataclass(frozen=True)
class KueueView:
    """What the protocol read of Kueue for a job labelled with a queue."""

    served: bool  # the API server serves Kueue's Workload API
    priority: tuple[str, int] | None = None  # the job's WorkloadPriorityClass and its value
    # The spec of each ResourceFlavor its admitted Workload names (nodeLabels, tolerations).
    flavors: dict[str, Obj] = field(default_factory=dict)

"""The children the operator reads back, as the watch delivers them: the chief's Job (parse_job),
the Workload Kueue admits (parse_workload, then what the queueing policy reads of it), and the nodes
of the job's pods (parse_node).

Promised (observe/views.py): a field that is missing or of an odd type reads as unknown, never as an
exception; every field of a view has the type it declares; the patches the queueing policy makes of
a Workload's conditions are writable. (The admission's flavors and podSetUpdates are read as Kueue's
CRD types them, maps of strings: the API server refuses anything else, so they are not fuzzed.)
"""

from __future__ import annotations

from datetime import UTC, datetime

import atheris

from psoperator.observe.views import JobView, NodeView, build_observed, parse_job, parse_node
from psoperator.observe.workload import WorkloadView
from psoperator.policies import queueing
from tests.fuzz import seeds
from tests.fuzz.invariants import conforms, writable
from tests.fuzz.mutate import Vocabulary, mutated, pick

JOBS = [c for c in seeds.children() if c["kind"] == "Job"]
WORKLOADS = [seeds.workload()]
NODES = seeds.nodes()
WORDS = Vocabulary.of(*JOBS, *WORKLOADS, *NODES)
NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def _named(obj: object, kind: str) -> dict[str, object] | None:
    """The object as the API server can deliver it: an object of its kind with a name."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
        return None
    if not isinstance(obj["metadata"].get("name"), str):
        return None
    return {**obj, "kind": kind}


def TestOneInput(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    conforms(parse_job(mutated(pick(fdp, JOBS), fdp, WORDS)), JobView)
    conforms(parse_node(mutated(pick(fdp, NODES), fdp, WORDS)), NodeView)
    workload = _named(mutated(pick(fdp, WORKLOADS), fdp, WORDS), "Workload")
    job = _named(mutated(pick(fdp, JOBS), fdp, WORDS), "Job")
    children = [c for c in (workload, job) if c is not None]
    observed = build_observed(children, [], seeds.JOB, {})
    if observed.workload is None:
        return
    view = observed.workload
    conforms(view, WorkloadView)
    queueing.waiting_reason("team-a", view)
    for patch in (
        queueing.give_back(view, NOW),
        queueing.finish(view, True, "done", NOW),
        queueing.pods_ready(view, NOW),
    ):
        writable(patch.status)

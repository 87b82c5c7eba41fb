"""Pods as the watch and the lists deliver them: parsed once into views (observe.views.parse_pod),
then read by the reconcile (Observed) and recorded in the tracking.

Promised (observe/views.py): a field that is missing or of an odd type reads as unknown, never as
an exception; so every field of a view has the type it declares, and what reads the views cannot
fail on them. A view's tracking record keeps the status writable and round-trips.
"""

from __future__ import annotations

import atheris

from psoperator.api.models import TrackedPod, Tracking
from psoperator.contract import Role
from psoperator.observe.failures import classify_pod_failure
from psoperator.observe.views import Observed, PodView, owned_pods, parse_pod
from psoperator.status.tracking import tracked
from tests.fuzz import seeds
from tests.fuzz.invariants import conforms, writable
from tests.fuzz.mutate import Vocabulary, mutated, pick

SEEDS = seeds.pods()
WORDS = Vocabulary.of(*SEEDS)


def TestOneInput(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    raw = [mutated(pick(fdp, SEEDS), fdp, WORDS) for _ in range(fdp.ConsumeIntInRange(1, 3))]
    views = [parse_pod(p) for p in raw if isinstance(p, dict)]
    for view in views:
        conforms(view, PodView)
    observed = Observed(pods=views, departed={v.uid: v for v in views if v.failed})
    for attempt in (0, 1):
        observed.current_pods(attempt)
        observed.former_chiefs(attempt)
        observed.last_chief_pod(attempt)
    for role in Role:
        observed.running(role)
    owned_pods(views, {"ctr-ps-uid"}, "ctr")
    records = {}
    for view in views:
        records[view.name] = tracked(view)
        for before, departed in (
            (TrackedPod(uid=view.uid, restarts=0, sidecarRestarts=0), {}),
            (TrackedPod(uid="gone", disruption="Evicted"), {"gone": view}),
        ):
            failure = classify_pod_failure(before, view, departed)
            if failure is not None:
                failure.describe()
    # A uid is a UUID the API server gives: the rows of statefulSets are "/"-separated.
    records = {name: r for name, r in records.items() if "/" not in r.uid}
    stored = Tracking(pods=records).model_dump(by_alias=True, exclude_none=True, mode="json")
    writable(stored)
    assert _rows_kept(Tracking.model_validate(stored).pods) == _rows_kept(records)


def _rows_kept(records: dict[str, TrackedPod]) -> dict[str, TrackedPod]:
    """The records as a StatefulSet's rows keep them: a "/" of a disruption's reason as "_"."""
    return {
        name: r.model_copy(update={"disruption": r.disruption.replace("/", "_") if r.disruption else None})
        for name, r in records.items()
    }

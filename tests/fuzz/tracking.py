"""The tracking of a job's status (status.tracking), as this version reads what it or an earlier one
wrote: records, the strings of earlier versions (TrackedPod.from_entry, StartError.from_entry) and
the rows of statefulSets.

Promised (api/models.py Tracking): whatever tracking the CRD's schema admits is read without an
exception (an entry that cannot be read is left out: its pod is then tracked afresh); what is read
is written back as a status the API server takes, and what is written reads back as it was.
"""

from __future__ import annotations

from typing import Any

import atheris

from psoperator.api.models import Tracking
from tests.fuzz import schema, seeds
from tests.fuzz.invariants import writable
from tests.fuzz.mutate import Vocabulary, mutated, pick

SEEDS = [s["tracking"] for s in seeds.statuses() if "tracking" in s]
WORDS = Vocabulary.of(*SEEDS)
SCHEMA = schema.root()["properties"]["status"]["properties"]["tracking"]


def TestOneInput(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    try:
        given: Any = schema.stored(mutated(pick(fdp, SEEDS), fdp, WORDS, most=8), SCHEMA, "tracking")
    except schema.Refused:
        return
    read = Tracking.model_validate(given)
    if not _row_safe(read):
        return
    stored = read.model_dump(by_alias=True, exclude_none=True, mode="json")
    writable(stored)
    again = Tracking.model_validate(stored).model_dump(by_alias=True, exclude_none=True, mode="json")
    assert _filled(again) == _filled(stored), (given, stored, again)


def _row_safe(tracking: Tracking) -> bool:
    """No "/" where a row could not keep it: a uid is a UUID the API server gives, a since a time the
    operator writes, and a disruption's "/" is kept as "_"."""
    errors = (tracking.start_errors or {}).values()
    fields = [f for p in tracking.pods.values() for f in (p.uid, p.disruption or "")]
    return not any("/" in f for f in fields + [f for e in errors for f in (e.uid, e.since)])


def _filled(tracking: dict[str, Any]) -> dict[str, Any]:
    """The tracking without its empty maps, which read as missing ones."""
    return {key: value for key, value in tracking.items() if value != {}}

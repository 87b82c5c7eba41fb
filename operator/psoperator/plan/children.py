"""The children diff: what to create, patch, replace or delete so that a job's children are as
rendered, decided without the API (kube.py carries it out)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from psoperator.api.labels import ANNOTATION_HASH, CHILD_KINDS, LABEL_ATTEMPT
from psoperator.observe.views import owned_by

Obj = dict[str, Any]


class ChildVerb(enum.Enum):
    CREATE = "create"
    PATCH = "patch"
    # Only the replaced chief Job of an older attempt is deleted; the current attempt's waits
    # (hold_chief) until no older chief pod runs.
    DELETE_REPLACED = "delete-replaced"
    DELETE = "delete"  # owned and no longer wanted (NetworkPolicies switched off)
    # Created if missing, never read nor changed: the chief's token Secret (the operator may not
    # read Secrets), with each chief Job.
    CREATE_ONLY = "create-only"


@dataclass(frozen=True)
class ChildChange:
    manifest: Obj
    verb: ChildVerb
    replaced: Obj | None = None  # a chief Job of an older attempt, deleted first
    # A merge patch sent before the patch: what an apply cannot remove, since no manager owns it.
    merge_first: Obj | None = None


def _stale_defaults(current: Obj, manifest: Obj) -> Obj | None:
    """What `current` keeps that an apply of `manifest` cannot remove and the API server refuses
    beside it: the `rollingUpdate` that defaulting gave a StatefulSet made by a version without
    `updateStrategy`, which OnDelete forbids (an apply of `rollingUpdate: null` keeps it too)."""
    wanted = manifest.get("spec", {}).get("updateStrategy", {}).get("type")
    live = current.get("spec", {}).get("updateStrategy", {})
    if manifest["kind"] != "StatefulSet" or wanted != "OnDelete" or "rollingUpdate" not in live:
        return None
    return {"spec": {"updateStrategy": {"type": wanted, "rollingUpdate": None}}}


def _attempt(obj: Obj) -> str | None:
    value = obj.get("metadata", {}).get("labels", {}).get(LABEL_ATTEMPT)
    return str(value) if value is not None else None


def plan_children(
    owner_uid: str,
    desired: list[Obj],
    observed: list[Obj],
    *,
    create_missing: bool = True,
    hold_chief: bool = False,
) -> tuple[list[ChildChange], list[str]]:
    """What to change so that the children are as desired, decided without the API: create what is
    missing, patch what differs (by hash), replace a chief Job of an old attempt, delete what the job
    owns and no longer wants. Objects of the same name that the job does not own are left alone (the
    conflicts returned with the changes, as "Kind/name").

    Without `create_missing` (the job has ended) only what exists is patched. With `hold_chief`
    (an older chief pod still runs) a chief Job of an old attempt is deleted, but the current
    attempt's is not created yet. The old chief pods are the plan's to delete (`delete_pods`).
    """
    conflicts: list[str] = []
    changes: list[ChildChange] = []
    live = {(o.get("kind"), o["metadata"]["name"]): o for o in observed}
    for manifest in desired:
        kind, name = manifest["kind"], manifest["metadata"]["name"]
        current = live.get((kind, name))
        if current is not None and not owned_by(current, owner_uid):
            conflicts.append(f"{kind}/{name}")
            continue
        replace = current is not None and kind == "Job" and _attempt(current) != _attempt(manifest)
        if current is not None and replace and _newer(_attempt(current), _attempt(manifest)):
            continue  # a replica that read an older status: the newer attempt is not its to replace
        if not create_missing and (current is None or replace):
            continue  # the job has ended: what is gone stays gone, the last chief stays as it ended
        if current is None or replace:
            held = hold_chief and _attempt(manifest) is not None  # waits until no older chief pod runs
            if replace or not held:
                verb = ChildVerb.DELETE_REPLACED if held else ChildVerb.CREATE
                changes.append(ChildChange(manifest, verb, current if replace else None))
        elif (
            current["metadata"].get("annotations", {}).get(ANNOTATION_HASH)
            != manifest["metadata"]["annotations"][ANNOTATION_HASH]
        ):
            stale = _stale_defaults(current, manifest)
            changes.append(ChildChange(manifest, ChildVerb.PATCH, merge_first=stale))
    wanted = {(m["kind"], m["metadata"]["name"]) for m in desired}
    for key, current in live.items():
        if key not in wanted and key[0] in CHILD_KINDS and owned_by(current, owner_uid):
            changes.append(ChildChange(current, ChildVerb.DELETE))
    return changes, conflicts


def with_chief_token(changes: list[ChildChange], secret: Obj) -> list[ChildChange]:
    """The changes, with the chief's token Secret created just before a chief Job is: its pod mounts it."""
    made: list[ChildChange] = []
    for change in changes:
        if change.verb is ChildVerb.CREATE and _attempt(change.manifest) is not None:  # a chief Job
            made.append(ChildChange(secret, ChildVerb.CREATE_ONLY))
        made.append(change)
    return made


def children_fingerprint(owner_uid: str, observed: list[Obj]) -> frozenset[tuple[Any, ...]]:
    """All that `plan_children` reads of the observed children: which exist, whether the job owns
    each, its attempt and its hash. Their status, which changes often, is not in it."""
    return frozenset(
        (
            o.get("kind"),
            o["metadata"]["name"],
            owned_by(o, owner_uid),
            _attempt(o),
            o["metadata"].get("annotations", {}).get(ANNOTATION_HASH),
        )
        for o in observed
    )


def _newer(live: str | None, wanted: str | None) -> bool:
    return bool(live and wanted and live.isdigit() and wanted.isdigit() and int(live) > int(wanted))

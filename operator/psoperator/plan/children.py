"""The children diff: what to create, patch, replace or delete so that a job's children are as
rendered, decided without the API (kube.py carries it out).

No pod runs unisolated: a job's NetworkPolicies come first, and a change that makes pods (a new
StatefulSet or Job, more replicas, a Job resumed) is made only after them. When one of them cannot
exist (another owner's object has its name) no such change is planned; when its create fails,
Kube.make_changes makes none. Pods that run already go on: nothing is scaled down or deleted for it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from psoperator.api.labels import ANNOTATION_HASH, CHILD_KINDS, LABEL_ATTEMPT
from psoperator.managed_fields import holds_updates
from psoperator.observe.views import owned_by

Obj = dict[str, Any]
# Changed by a merge patch of their changeable fields only (render.changeable), never applied whole.
MERGE_PATCHED = frozenset({"Job", "Workload"})


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
    # The child holds fields of the operator's updates (its create): they are folded into its
    # apply's first (managed_fields.py), so that the patch removes what the render no longer has.
    fold_updates: bool = False
    # The uid of the child a patch is for, sent with it: the API server refuses the patch of an
    # object of that name with another uid, and makes none when there is no object.
    uid: str | None = None
    # It makes pods: made only once the job's NetworkPolicies are (Kube.make_changes).
    makes_pods: bool = False

    @property
    def isolates(self) -> bool:
        """A NetworkPolicy of the job that does not exist yet."""
        return self.manifest["kind"] == "NetworkPolicy" and self.verb is ChildVerb.CREATE


POD_MAKERS = ("StatefulSet", "Job")


def _makes_pods(current: Obj | None, manifest: Obj) -> bool:
    """Whether writing `manifest` over `current` (None: a create) makes pods: a new StatefulSet or Job,
    a StatefulSet given more replicas, a suspended Job resumed."""
    kind, spec = manifest["kind"], manifest.get("spec", {})
    if kind not in POD_MAKERS:
        return False
    if current is None:
        return True
    live = current.get("spec", {})
    if kind == "StatefulSet":
        return int(spec.get("replicas") or 0) > int(live.get("replicas") or 0)
    return bool(live.get("suspend")) and not spec.get("suspend")


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
    The NetworkPolicies come first; while one cannot be made, nothing that makes pods is.
    """
    conflicts: list[str] = []
    changes: list[ChildChange] = []
    live = {(o.get("kind"), o["metadata"]["name"]): o for o in observed}
    unisolated = _policy_taken(owner_uid, desired, live)
    for manifest in sorted(desired, key=lambda m: m["kind"] != "NetworkPolicy"):
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
        makes_pods = _makes_pods(None if replace else current, manifest)
        if current is None or replace:
            # The current attempt's chief waits until no older chief pod runs; every pod, for isolation.
            held = (hold_chief and _attempt(manifest) is not None) or (unisolated and makes_pods)
            if replace or not held:
                verb = ChildVerb.DELETE_REPLACED if held else ChildVerb.CREATE
                replaced = current if replace else None
                changes.append(ChildChange(manifest, verb, replaced, makes_pods=makes_pods))
        elif (
            current["metadata"].get("annotations", {}).get(ANNOTATION_HASH)
            != manifest["metadata"]["annotations"][ANNOTATION_HASH]
        ) and not (unisolated and makes_pods):
            fold = kind not in MERGE_PATCHED and holds_updates(current)
            uid = current["metadata"].get("uid")
            change = ChildChange(manifest, ChildVerb.PATCH, fold_updates=fold, uid=uid, makes_pods=makes_pods)
            changes.append(change)
    wanted = {(m["kind"], m["metadata"]["name"]) for m in desired}
    for key, current in live.items():
        if key not in wanted and key[0] in CHILD_KINDS and owned_by(current, owner_uid):
            changes.append(ChildChange(current, ChildVerb.DELETE))
    return changes, conflicts


def _policy_taken(owner_uid: str, desired: list[Obj], live: dict[tuple[Any, str], Obj]) -> bool:
    """Whether a NetworkPolicy the job wants has its name taken by an object the job does not own."""
    for manifest in desired:
        current = live.get((manifest["kind"], manifest["metadata"]["name"]))
        if manifest["kind"] == "NetworkPolicy" and current is not None and not owned_by(current, owner_uid):
            return True
    return False


def with_chief_token(changes: list[ChildChange], secret: Obj) -> list[ChildChange]:
    """The changes, with the chief's token Secret created just before a chief Job is: its pod mounts it."""
    made: list[ChildChange] = []
    for change in changes:
        if change.verb is ChildVerb.CREATE and _attempt(change.manifest) is not None:  # a chief Job
            made.append(ChildChange(secret, ChildVerb.CREATE_ONLY))
        made.append(change)
    return made


def children_fingerprint(owner_uid: str, observed: list[Obj]) -> frozenset[tuple[Any, ...]]:
    """All that decides whether `plan_children` changes the observed children: which exist, whether
    the job owns each, its attempt and its hash. Their status, which changes often, is not in it, nor
    their fields' managers, which decide how a patch is made, never whether."""
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

"""Which fields of a child the operator's server-side applies own, so that a field a later render
drops is removed from the child.

The API server removes a field an apply stops sending only if no other manager owns it. The
operator creates its children with POST (a name taken by a stranger then fails, nothing is taken
over), which records an Update entry owning every field created: FIELD_MANAGER's, or LEGACY_MANAGER's
for a child of an earlier version, which sent no fieldManager. Before it applies a child that holds
such entries, the operator folds them into its Apply entry (`folded`), as client-go's csaupgrade
does: the Apply entry then owns the union of their fields, and an apply that drops one removes it.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

FIELD_MANAGER = "ps-training-operator"
# The manager the API server names for a request without fieldManager: its User-Agent up to the
# first "/" (the Kubernetes Python client sends "OpenAPI-Generator/<version>/python").
LEGACY_MANAGER = "OpenAPI-Generator"
_OUR_UPDATERS = frozenset({FIELD_MANAGER, LEGACY_MANAGER})


def folds(entry: Obj) -> bool:
    """An entry to fold into the Apply entry: an Update of the object itself (a subresource's, such
    as a controller's status, is not ours) by one of our managers."""
    return (
        entry.get("operation") == "Update"
        and entry.get("manager") in _OUR_UPDATERS
        and not entry.get("subresource")
    )


def holds_updates(obj: Obj) -> bool:
    """Whether `obj` has entries to fold before an apply."""
    return any(folds(entry) for entry in obj.get("metadata", {}).get("managedFields") or [])


def folded(managed_fields: list[Obj], api_version: str) -> list[Obj] | None:
    """`managed_fields` with the entries to fold of `api_version` (a field set is that version's)
    merged into FIELD_MANAGER's Apply entry of that version, made if there is none; None when there
    is nothing to fold."""
    updates = [e for e in managed_fields if folds(e) and e.get("apiVersion") == api_version]
    if not updates:
        return None
    applies = [e for e in managed_fields if _our_apply(e, api_version)]
    fields: Obj = {}
    for entry in applies + updates:
        fields = union(fields, entry.get("fieldsV1") or {})
    made = {"manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": api_version}
    merged = {**(applies[0] if applies else made), "fieldsType": "FieldsV1", "fieldsV1": fields}
    return [merged, *(e for e in managed_fields if e not in applies + updates)]


def _our_apply(entry: Obj, api_version: str) -> bool:
    key = (entry.get("manager"), entry.get("operation"), entry.get("apiVersion"))
    return key == (FIELD_MANAGER, "Apply", api_version) and not entry.get("subresource")


def union(a: Obj, b: Obj) -> Obj:
    """The union of two field sets in FieldsV1 form. Each key names a field or list item and maps to
    the set below it; an empty set means the field itself is in the set, and a "." key says so beside
    the fields below it."""
    merged = dict(a)
    for key, below in b.items():
        merged[key] = _union_below(merged[key], below) if key in merged and key != "." else below
    return merged


def _union_below(a: Obj, b: Obj) -> Obj:
    if a and b:
        return union(a, b)
    # One of them is the field itself ({}): the field, and what the other has below it.
    below = a or b
    return {".": {}, **below} if below else {}

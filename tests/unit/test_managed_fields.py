"""Folding the operator's Update entries into its Apply entry: field sets in FieldsV1 form, as the
API server writes them."""

from __future__ import annotations

from typing import Any

import pytest

from psoperator.managed_fields import FIELD_MANAGER, LEGACY_MANAGER, folded, holds_updates, union

Obj = dict[str, Any]

TF_CONFIG = 'k:{"name":"TF_CONFIG"}'
TRAINER = 'k:{"name":"trainer"}'


def _env(*names: str) -> Obj:
    """The field set of a StatefulSet's trainer container's env entries of `names`."""
    entries: Obj = {f'k:{{"name":"{n}"}}': {".": {}, "f:name": {}, "f:value": {}} for n in names}
    return {"f:spec": {"f:template": {"f:spec": {"f:containers": {TRAINER: {"f:env": entries}}}}}}


def _entry(manager: str, operation: str, fields: Obj, **extra: str) -> Obj:
    return {
        "manager": manager,
        "operation": operation,
        "apiVersion": "apps/v1",
        "time": "2026-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
        **extra,
    }


STATUS = _entry("kube-controller-manager", "Update", {"f:status": {"f:replicas": {}}}, subresource="status")


@pytest.mark.parametrize(
    ("a", "b", "both"),
    [
        ({"f:a": {}}, {"f:b": {}}, {"f:a": {}, "f:b": {}}),
        # A field in one set, a field below it in the other: the field and the one below.
        ({"f:a": {}}, {"f:a": {"f:x": {}}}, {"f:a": {".": {}, "f:x": {}}}),
        ({"f:a": {"f:x": {}}}, {"f:a": {}}, {"f:a": {".": {}, "f:x": {}}}),
        # Only fields below it in both: the field itself stays out.
        ({"f:a": {"f:x": {}}}, {"f:a": {"f:y": {}}}, {"f:a": {"f:x": {}, "f:y": {}}}),
        ({"f:a": {".": {}, "f:x": {}}}, {"f:a": {"f:y": {}}}, {"f:a": {".": {}, "f:x": {}, "f:y": {}}}),
        ({"f:a": {}}, {"f:a": {}}, {"f:a": {}}),
        (_env("TF_CONFIG"), _env("PSOP_ROLE"), _env("TF_CONFIG", "PSOP_ROLE")),
    ],
)
def test_the_union_of_two_field_sets_has_every_field_of_either(a: Obj, b: Obj, both: Obj) -> None:
    assert union(a, b) == both
    assert union(b, a) == both


def test_the_creates_fields_become_the_applys_and_the_rest_is_kept() -> None:
    """A child made by POST (an Update entry), applied since: one Apply entry owning both sets."""
    managed = [
        _entry(FIELD_MANAGER, "Update", _env("TF_CONFIG", "PSOP_ROLE")),
        STATUS,
        _entry(FIELD_MANAGER, "Apply", _env("PSOP_ROLE", "PSOP_TF_CONFIG_FILE")),
    ]
    assert folded(managed, "apps/v1") == [
        _entry(FIELD_MANAGER, "Apply", _env("PSOP_ROLE", "PSOP_TF_CONFIG_FILE", "TF_CONFIG")),
        STATUS,
    ]


def test_a_child_of_an_earlier_version_gets_an_apply_entry_of_its_creates_and_merges_fields() -> None:
    """Earlier versions sent no fieldManager: the API server named their writes after the client."""
    managed = [_entry(LEGACY_MANAGER, "Update", _env("TF_CONFIG")), STATUS]
    merged = _entry(LEGACY_MANAGER, "Update", {"f:spec": {"f:updateStrategy": {"f:type": {}}}})
    [apply, status] = folded([*managed, merged], "apps/v1") or []
    assert status == STATUS
    assert {k: apply[k] for k in ("manager", "operation", "apiVersion", "fieldsType")} == {
        "manager": FIELD_MANAGER,
        "operation": "Apply",
        "apiVersion": "apps/v1",
        "fieldsType": "FieldsV1",
    }
    assert apply["fieldsV1"] == union(_env("TF_CONFIG"), {"f:spec": {"f:updateStrategy": {"f:type": {}}}})


@pytest.mark.parametrize(
    ("entry", "held"),
    [
        (_entry("kubectl-edit", "Update", _env("DEBUG")), False),  # someone else's
        (_entry(FIELD_MANAGER, "Update", {"f:status": {}}, subresource="status"), False),
        # Ours, but its field set is of another version: the plan asks, and the fold finds none.
        ({**_entry(FIELD_MANAGER, "Update", _env("TF_CONFIG")), "apiVersion": "apps/v1beta2"}, True),
    ],
    ids=["another manager", "a subresource", "another version"],
)
def test_only_the_operators_updates_of_the_object_in_the_applied_version_are_folded(
    entry: Obj, held: bool
) -> None:
    assert folded([_entry(FIELD_MANAGER, "Apply", _env("PSOP_ROLE")), entry], "apps/v1") is None
    assert holds_updates({"metadata": {"managedFields": [entry]}}) is held


def test_a_child_holds_updates_to_fold_until_they_are_folded() -> None:
    created = {"metadata": {"managedFields": [_entry(FIELD_MANAGER, "Update", _env("TF_CONFIG")), STATUS]}}
    assert holds_updates(created)
    applied = {"metadata": {"managedFields": folded(created["metadata"]["managedFields"], "apps/v1")}}
    assert not holds_updates(applied)
    assert not holds_updates({"metadata": {}})

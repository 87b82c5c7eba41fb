"""The intent of the CRD's CEL rules, evaluated offline with cel-python.

The harness does what the apiserver does for `x-kubernetes-validations`, as far as these rules
need: it applies the schema's defaults, evaluates every rule whose field is present with `self`
bound to it, and evaluates transition rules (those that use `oldSelf`) only on an update where the
old object has the field too (in a list-type map: an item with the same key). The same cases run
against a real apiserver in e2e/test_crd_validation.py; this file pins the rules' intent in
milliseconds.
"""

from __future__ import annotations

import copy
import os
from functools import cache
from typing import Any

import pytest

from e2e.bad_input import CATALOGUE, REMOVE, BadInput, manifest, set_path
from psoperator import contract
from psoperator.api import crd, crd_rules

try:
    import celpy
    from celpy.adapter import json_to_cel
except ImportError:  # pragma: no cover - depends on the environment
    if os.environ.get("CI"):
        raise
    pytest.skip("cel-python is not installed (pip install -e '.[dev]')", allow_module_level=True)

Violation = tuple[str, str]  # (field path, message)


@cache
def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression))


@cache
def _schema() -> dict[str, Any]:
    schema: dict[str, Any] = crd.render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _cel(value: Any) -> Any:
    return json_to_cel(value)


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    if isinstance(value, dict):
        for name, child in schema.get("properties", {}).items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = apply_defaults(child, value[name])
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key in value:
                value[key] = apply_defaults(additional, value[key])
    elif isinstance(value, list) and "items" in schema:
        value = [apply_defaults(schema["items"], item) for item in value]
    return value


def _check(schema: dict[str, Any], new: Any, old: Any, has_old: bool, path: str) -> list[Violation]:
    found: list[Violation] = []
    for rule in schema.get("x-kubernetes-validations", []):
        transition = "oldSelf" in rule["rule"]
        if transition and not has_old:
            continue
        bindings = {"self": _cel(new)}
        if transition:
            bindings["oldSelf"] = _cel(old)
        if not _program(rule["rule"]).evaluate(bindings):
            found.append((path + rule.get("fieldPath", ""), rule["message"]))
    if isinstance(new, dict):
        for name, child in schema.get("properties", {}).items():
            if name in new:
                child_has_old = has_old and isinstance(old, dict) and name in old
                child_old = old[name] if child_has_old else None
                found += _check(child, new[name], child_old, child_has_old, f"{path}.{name}")
    elif isinstance(new, list) and "items" in schema:
        for i, item in enumerate(new):
            item_old = _correlated(schema, item, old if has_old else None)
            found += _check(schema["items"], item, item_old, item_old is not None, f"{path}[{i}]")
    return found


def _correlated(schema: dict[str, Any], item: Any, old: Any) -> Any:
    """The old item a transition rule compares a list item with: only a list-type map has one, the
    item with the same keys (none: the item is new, and its transition rules are not evaluated)."""
    if schema.get("x-kubernetes-list-type") != "map" or not isinstance(old, list):
        return None
    keys = schema["x-kubernetes-list-map-keys"]
    return next((o for o in old if all(o.get(k) == item.get(k) for k in keys)), None)


def validate(new: dict[str, Any], old: dict[str, Any] | None = None) -> list[Violation]:
    """Violations of the CRD's CEL rules by a create (old None) or an update."""
    schema = _schema()
    new = apply_defaults(schema, copy.deepcopy(new))
    if old is not None:
        old = apply_defaults(schema, copy.deepcopy(old))
    return [(p.removeprefix("."), m) for p, m in _check(schema, new, old, old is not None, "")]


def job(**spec: Any) -> dict[str, Any]:
    """A valid job, with spec fields merged from keyword arguments (one level deep)."""
    container = {"name": "trainer", "image": "example.com/ctr-trainer:1.0"}
    base: dict[str, Any] = {
        "apiVersion": "psoperator.io/v1alpha1",
        "kind": "PSTrainingJob",
        "metadata": {"name": "ctr", "namespace": "default"},
        "spec": {
            "chief": {"template": {"spec": {"containers": [dict(container)]}}},
            "ps": {"replicas": 2, "template": {"spec": {"containers": [dict(container)]}}},
            "worker": {"replicas": 4, "template": {"spec": {"containers": [dict(container)]}}},
            "checkpoint": {"dir": "/checkpoints"},
        },
    }
    for key, value in spec.items():
        current = base["spec"].get(key)
        base["spec"][key] = {**current, **value} if isinstance(current, dict) else value
    return base


def fields(violations: list[Violation]) -> list[str]:
    return [p for p, _ in violations]


def test_a_valid_job_passes_on_create_and_unchanged_update() -> None:
    assert validate(job()) == []
    assert validate(job(), old=job()) == []


def test_a_full_job_passes() -> None:
    full = job(
        image="example.com/ctr-trainer:1.0",
        port=5000,
        evaluator={"template": {"spec": {"containers": [{"name": "eval"}]}}},
        checkpoint={"dir": "/ckpt", "volume": {"persistentVolumeClaim": {"claimName": "ctr-ckpt"}}},
        failurePolicy={"maxRestarts": 3, "permanentExitCodes": [1, 2, 255]},
        model={"parameters": 1280000000, "optimizer": "adam"},
    )
    assert validate(full) == []
    assert validate(full, old=full) == []


CEL_CAUGHT = [case for case in CATALOGUE if "CEL" in case.caught_by]


@pytest.mark.parametrize("case", CEL_CAUGHT, ids=[c.id for c in CEL_CAUGHT])
def test_the_catalogue_cases_a_cel_rule_catches_are_caught_offline(case: BadInput) -> None:
    """The bad-input catalogue (e2e/bad_input.py), whose cases the e2e tests send to an API server."""
    old = manifest() if case.update else None
    violations = validate(case.apply(manifest()), old=old)
    said = [f"{field}: {message}" for field, message in violations]
    assert any(all(words in text for words in case.expected) for text in said), said


@pytest.mark.parametrize("directory", ["/checkpoints", "gs://bucket/run-1", "s3://bucket"])
def test_checkpoint_dir_forms_that_are_accepted(directory: str) -> None:
    assert validate(job(checkpoint={"dir": directory})) == []


def test_the_longest_job_name_is_accepted() -> None:
    assert validate(set_path(job(), "metadata.name", "a" * crd_rules.MAX_JOB_NAME_LENGTH)) == []


def test_an_image_set_at_creation_cannot_be_removed() -> None:
    old = job(image="example.com/ctr-trainer:1.0")
    assert fields(validate(set_path(old, "spec.image", REMOVE), old=old)) == ["spec.image"]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.runPolicy.suspend", True),
        ("spec.runPolicy.activeDeadlineSeconds", 3600),
        ("spec.runPolicy.ttlSecondsAfterFinished", 600),
        ("spec.runPolicy.cleanPodPolicy", "None"),
        ("spec.failurePolicy.maxRestarts", 10),
        ("spec.failurePolicy.permanentExitCodes", [2]),
        ("spec.failurePolicy.workerPermanentExit", "Record"),
        ("spec.failurePolicy.stallTimeoutSeconds", 900),
        ("spec.failurePolicy.schedulingTimeoutSeconds", 900),
        ("spec.failurePolicy.startupErrorGraceSeconds", 60),
        ("spec.ps.replicas", 3),
        ("spec.worker.replicas", 1),
        (
            "spec.ps.template.spec.containers.0.resources",
            {"requests": {"memory": "8Gi", "cpu": 2}, "limits": {"memory": "12Gi"}},
        ),
    ],
)
def test_mutable_fields_can_change(path: str, value: Any) -> None:
    old = job()
    assert validate(set_path(old, path, value), old=old) == []


def test_defaults_do_not_count_as_changes() -> None:
    """An update that omits defaulted fields is defaulted the same way, so nothing changed."""
    old = job(port=2222, failurePolicy={"maxRestarts": 5}, scheduling={})
    assert validate(job(), old=old) == []


def test_containers_without_an_image_are_accepted_with_spec_image() -> None:
    imageless = {
        "template": {"spec": {"containers": [{"name": "trainer"}], "initContainers": [{"name": "i"}]}}
    }
    assert validate(job(image="example.com/ctr-trainer:1.0", chief=imageless, evaluator=imageless)) == []


def test_a_ps_container_s_resources_can_change_again_and_be_removed() -> None:
    old = set_path(job(), "spec.ps.template.spec.containers.0.resources", {"limits": {"memory": "8Gi"}})
    raised = set_path(old, "spec.ps.template.spec.containers.0.resources.limits.memory", "16Gi")
    assert validate(raised, old=old) == []
    assert validate(set_path(old, "spec.ps.template.spec.containers.0.resources", REMOVE), old=old) == []


def test_only_the_ps_template_s_resources_are_mutable_not_the_worker_s() -> None:
    path = "spec.worker.template.spec.containers.0.resources"
    old = job()
    changed = set_path(old, path, {"limits": {"memory": "8Gi"}})
    assert fields(validate(changed, old=old)) == ["spec.worker.template"]


def _with_trainer(role: str, **fields: Any) -> dict[str, Any]:
    """A valid job whose `role` runs one container with `fields` added."""
    trainer = {"name": "trainer", "image": "example.com/ctr-trainer:1.0", **fields}
    return job(**{role: {"template": {"spec": {"containers": [trainer]}}}})


@pytest.mark.parametrize("role", crd_rules.ROLES)
@pytest.mark.parametrize("name", [*contract.INJECTED_ENV, "PSOP_NOT_YET_INJECTED"])
def test_every_variable_the_operator_sets_is_refused_in_every_role(role: str, name: str) -> None:
    """Each variable the renderer injects is reserved (TF_CONFIG, or the PSOP_ prefix), and so is a
    variable of the prefix that a later version may inject."""
    obj = _with_trainer(role, env=[{"name": name, "value": "9000"}])
    assert fields(validate(obj)) == [f"spec.{role}.template.spec.containers[0].env[0]"]


@pytest.mark.parametrize("role", crd_rules.ROLES)
@pytest.mark.parametrize("name", contract.INJECTED_PORT_NAMES)
def test_every_port_name_the_operator_declares_is_refused_in_every_role(role: str, name: str) -> None:
    obj = _with_trainer(role, ports=[{"name": name, "containerPort": 9999}])
    assert fields(validate(obj)) == [f"spec.{role}.template.spec.containers[0].ports[0]"]


def test_a_template_keeps_its_own_variables_ports_and_the_pod_network() -> None:
    own = _with_trainer(
        "chief",
        env=[{"name": "TF_CONFIG_X", "value": "1"}, {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "2"}],
        ports=[{"name": "grpc", "containerPort": 2222}, {"containerPort": 6006}],
    )
    own["spec"]["chief"]["template"]["spec"]["hostNetwork"] = False
    assert validate(own) == []

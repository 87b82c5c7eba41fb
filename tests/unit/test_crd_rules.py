"""The intent of the CRD's CEL rules, evaluated offline with cel-python.

The harness does what the apiserver does for `x-kubernetes-validations`, as far as these rules
need: it applies the schema's defaults, evaluates every rule whose field is present with `self`
bound to it, and evaluates transition rules (those that use `oldSelf`) only on an update where the
old object has the field too. The same cases run against a real apiserver in
e2e/test_crd_validation.py; this file pins the rules' intent in milliseconds.
"""

from __future__ import annotations

import copy
import os
from functools import cache
from typing import Any

import pytest

from psoperator import crd

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
        # None of our rules inside lists is a transition rule, so items need no old value.
        for i, item in enumerate(new):
            found += _check(schema["items"], item, None, False, f"{path}[{i}]")
    return found


def validate(new: dict[str, Any], old: dict[str, Any] | None = None) -> list[Violation]:
    """Violations of the CRD's CEL rules by a create (old None) or an update."""
    schema = _schema()
    new = apply_defaults(schema, copy.deepcopy(new))
    if old is not None:
        old = apply_defaults(schema, copy.deepcopy(old))
    return [(p.removeprefix("."), m) for p, m in _check(schema, new, old, old is not None, "")]


def job(**spec: Any) -> dict[str, Any]:
    """A valid job, with spec fields replaced by keyword arguments."""
    container = {"name": "trainer", "image": "example.com/ctr-trainer:1.0"}
    base: dict[str, Any] = {
        "apiVersion": "psoperator.io/v1alpha1",
        "kind": "PSTrainingJob",
        "metadata": {"name": "ctr", "namespace": "default"},
        "spec": {
            "chief": {"template": {"spec": {"containers": [container]}}},
            "ps": {"replicas": 2, "template": {"spec": {"containers": [container]}}},
            "worker": {"replicas": 4, "template": {"spec": {"containers": [container]}}},
            "checkpoint": {"dir": "/checkpoints"},
        },
    }
    base["spec"].update(spec)
    return base


def updated(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of obj with the dotted path set to value (None deletes it)."""
    new = copy.deepcopy(obj)
    *parents, last = path.split(".")
    node = new
    for name in parents:
        node = node.setdefault(name, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return new


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


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({"port": 0}, "spec.port", "1 to 65535"),
        ({"port": 70000}, "spec.port", "1 to 65535"),
        ({"chief": {"replicas": 2}}, "spec.chief.replicas", "must be 1"),
        ({"ps": {"replicas": 0}}, "spec.ps.replicas", "at least one parameter server"),
        ({"ps": {"replicas": 1001}}, "spec.ps.replicas", "1 to 1000"),
        ({"worker": {"replicas": 0}}, "spec.worker.replicas", "at least one worker"),
        ({"checkpoint": {"dir": "checkpoints"}}, "spec.checkpoint.dir", "absolute path"),
        ({"checkpoint": {"dir": "file:///ckpt"}}, "spec.checkpoint.dir", "gs://, s3:// or hdfs://"),
        ({"checkpoint": {"dir": "gs://"}}, "spec.checkpoint.dir", "naming a bucket or host"),
        (
            {"checkpoint": {"dir": "gs://bucket/ckpt", "volume": {"emptyDir": {}}}},
            "spec.checkpoint.volume",
            "needs spec.checkpoint.dir to be an absolute path",
        ),
        (
            {"failurePolicy": {"permanentExitCodes": [2, 300]}},
            "spec.failurePolicy.permanentExitCodes[1]",
            "1 to 255",
        ),
        (
            {"failurePolicy": {"permanentExitCodes": [0]}},
            "spec.failurePolicy.permanentExitCodes[0]",
            "0 is success",
        ),
    ],
)
def test_invalid_specs_are_rejected_with_the_field_and_why(
    spec: dict[str, Any], field: str, words: str
) -> None:
    violations = validate(job(**spec))
    assert fields(violations) == [field]
    assert words in violations[0][1]


@pytest.mark.parametrize(
    "directory", ["/checkpoints", "gs://bucket/run-1", "s3://bucket", "hdfs://nn:8020/ckpt"]
)
def test_checkpoint_dir_forms_that_are_accepted(directory: str) -> None:
    assert validate(job(checkpoint={"dir": directory})) == []


@pytest.mark.parametrize("name", ["a" * (crd.MAX_JOB_NAME_LENGTH + 1), "1job", "job-", "Job"])
def test_job_names_that_cannot_prefix_service_names_are_rejected(name: str) -> None:
    violations = validate(updated(job(), "metadata.name", name))
    assert len(violations) == 1
    assert violations[0][1].startswith("metadata.name must be at most")


def test_the_longest_job_name_is_accepted() -> None:
    assert validate(updated(job(), "metadata.name", "a" * crd.MAX_JOB_NAME_LENGTH)) == []


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("spec.port", 2223, "spec.port"),
        ("spec.ps.replicas", 3, "spec.ps.replicas"),
        ("spec.worker.replicas", 8, "spec.worker.replicas"),
        ("spec.ps.template", {"spec": {"containers": [{"name": "other"}]}}, "spec.ps.template"),
        ("spec.chief.template", None, "spec.chief.template"),
        ("spec.image", "example.com/other:2", "spec.image"),
        ("spec.evaluator", {"template": {}}, "spec.evaluator"),
        ("spec.model", {"parameters": 10}, "spec.model"),
        ("spec.checkpoint.dir", "/elsewhere", "spec.checkpoint"),
        ("spec.checkpoint.volume", {"emptyDir": {}}, "spec.checkpoint"),
        ("spec.scheduling.schedulerName", "volcano", "spec.scheduling"),
        ("spec.failurePolicy.connectTimeoutSeconds", 60, "spec.failurePolicy.connectTimeoutSeconds"),
    ],
)
def test_immutable_fields_cannot_change(path: str, value: Any, field: str) -> None:
    old = job()
    violations = validate(updated(old, path, value), old=old)
    assert fields(violations) == [field]
    assert "after creation" in violations[0][1]


def test_an_image_set_at_creation_cannot_be_removed() -> None:
    old = job(image="example.com/ctr-trainer:1.0")
    assert fields(validate(updated(old, "spec.image", None), old=old)) == ["spec.image"]


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
    ],
)
def test_mutable_fields_can_change(path: str, value: Any) -> None:
    old = job()
    assert validate(updated(old, path, value), old=old) == []


def test_defaults_do_not_count_as_changes() -> None:
    """An update that omits defaulted fields is defaulted the same way, so nothing changed."""
    old = job(port=2222, failurePolicy={"maxRestarts": 5}, scheduling={})
    assert validate(job(), old=old) == []

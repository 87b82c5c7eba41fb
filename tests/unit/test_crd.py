"""The generated CRD: committed copies in sync, structural, described, defaulted, small enough."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from psoperator.api import crd, crd_rules, crd_schema
from psoperator.api.schemas import extract

ROOT = Path(__file__).resolve().parents[2]
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
REGENERATE = "regenerate with `psoperator crd --write` and commit both files"

# Keys a structural schema node may carry (apiextensions.k8s.io/v1 JSONSchemaProps we use).
ALLOWED_KEYS = {
    "type",
    "description",
    "properties",
    "required",
    "items",
    "additionalProperties",
    "default",
    "format",
    *extract.VALUE_CHECKS,
    "anyOf",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
}


@cache
def openapi() -> dict[str, Any]:
    """The rendered schema, once per session: tests read it and never change it."""
    schema: dict[str, Any] = crd.render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


@cache
def rendered_yaml() -> str:
    return crd.render_crd_yaml()


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its dotted path ("[]" for list items, "{}" for map values)."""
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}" if path else name)
    if "items" in node:
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def at(path: str) -> dict[str, Any]:
    """The schema node at a dotted path of walk's form ("[]" steps into a list's items)."""
    node = openapi()
    for name in path.split("."):
        node = node["properties"][name.removesuffix("[]" * name.count("[]"))]
        for _ in range(name.count("[]")):
            node = node["items"]
    return node


@pytest.mark.parametrize("relative", crd.CRD_FILES, ids=str)
def test_committed_crd_matches_the_generator(relative: Path) -> None:
    committed = (ROOT / relative).read_text()
    assert committed == rendered_yaml(), f"{relative} is stale: {REGENERATE}"


def test_committed_yaml_parses_to_the_rendered_manifest() -> None:
    text = (ROOT / crd.CRD_FILES[0]).read_text()
    assert yaml.load(text, Loader=LOADER) == crd.render_crd()


def test_render_is_deterministic() -> None:
    assert crd.render_crd_yaml() == crd.render_crd_yaml()


def test_names_and_version() -> None:
    manifest = crd.render_crd()
    spec = manifest["spec"]
    assert manifest["metadata"]["name"] == "pstrainingjobs.psoperator.io"
    assert spec["group"] == "psoperator.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "PSTrainingJob"
    assert spec["names"]["plural"] == "pstrainingjobs"
    assert spec["names"]["singular"] == "pstrainingjob"
    assert spec["names"]["shortNames"] == ["psjob", "psjobs"]
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_every_node_is_structural() -> None:
    problems = []
    for path, node in walk(openapi()):
        if set(node) - ALLOWED_KEYS:
            problems.append(f"{path}: unexpected {sorted(set(node) - ALLOWED_KEYS)}")
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        # Kubernetes' two exceptions to "every node has a type".
        untyped = int_or_string or node.get("x-kubernetes-preserve-unknown-fields") is True
        if "type" not in node and not untyped:
            problems.append(f"{path}: no type")
        if int_or_string and "type" in node:
            problems.append(f"{path}: int-or-string with a type")
        if "anyOf" in node and node["anyOf"] != [{"type": "integer"}, {"type": "string"}]:
            problems.append(f"{path}: anyOf other than int-or-string")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{path}: properties and additionalProperties")
        if node.get("type") == "array" and "items" not in node:
            problems.append(f"{path}: array without items")
        if "format" in node and node["format"] not in extract.ALLOWED_FORMATS:
            problems.append(f"{path}: format {node['format']}")
        if "default" in node and node["default"] is None:
            problems.append(f"{path}: null default")
        for required in node.get("required", []):
            if required not in node.get("properties", {}):
                problems.append(f"{path}: required {required} is not a property")
    assert problems == []


def test_list_map_keys_are_required_or_defaulted() -> None:
    checked = 0
    for path, node in walk(openapi()):
        if node.get("x-kubernetes-list-type") != "map":
            continue
        item = node["items"]
        for key in node["x-kubernetes-list-map-keys"]:
            checked += 1
            defaulted = "default" in item["properties"][key]
            assert key in item.get("required", []) or defaulted, f"{path}: list-map key {key}"
    assert checked > 10  # containers, env, ports, volumes, ... and status.conditions


def test_no_refs_or_nullables_left() -> None:
    text = json.dumps(openapi())
    assert "$ref" not in text
    assert "nullable" not in text
    assert crd_schema.UPSTREAM_MARKER not in text
    assert '"title"' not in text


def test_pod_templates_embed_the_upstream_schema() -> None:
    for role in ("chief", "ps", "worker", "evaluator"):
        template = at(f"spec.{role}.template")
        assert template["description"], role  # ours, not upstream's
        containers = template["properties"]["spec"]["properties"]["containers"]
        assert containers["x-kubernetes-list-map-keys"] == ["name"]
        container = containers["items"]["properties"]
        assert {"name", "image", "command", "env", "resources", "volumeMounts"} <= set(container)
        limits = container["resources"]["properties"]["limits"]["additionalProperties"]
        assert limits["x-kubernetes-int-or-string"] is True
        assert set(template["properties"]["metadata"]["properties"]) == {"labels", "annotations"}
        assert "ephemeralContainers" not in template["properties"]["spec"]["properties"]


def test_checkpoint_volume_is_a_volume_source_without_name() -> None:
    volume = at("spec.checkpoint.volume")
    assert "name" not in volume["properties"]
    assert "name" not in volume.get("required", [])
    assert volume["properties"]["persistentVolumeClaim"]["required"] == ["claimName"]
    assert "description" in volume


def test_every_field_of_ours_is_described() -> None:
    """Everything outside the embedded upstream schemas explains itself in `kubectl explain`."""
    undescribed = []
    for path, node in walk(openapi()):
        if "template" in path.split(".") or path.startswith("spec.checkpoint.volume."):
            continue
        if path.endswith(("[]", "}")) or path == "metadata":
            continue  # list items and map values are described by their field; metadata is ObjectMeta
        if not node.get("description"):
            undescribed.append(path)
    assert undescribed == []


def test_a_few_descriptions() -> None:
    assert "gs:// or s3:// URI" in at("spec.checkpoint.dir")["description"]
    assert "mounted at dir" in at("spec.checkpoint.volume")["description"]
    assert "exactly one chief" in at("spec.chief.replicas")["description"]
    assert at("spec")["description"]
    assert openapi()["description"].startswith("PSTrainingJob runs")


@pytest.mark.parametrize(
    ("path", "default"),
    [
        ("spec.port", 2222),
        ("spec.failurePolicy", {}),
        ("spec.failurePolicy.maxRestarts", 5),
        ("spec.failurePolicy.permanentExitCodes", [1, 2]),
        ("spec.failurePolicy.connectTimeoutSeconds", 600),
        ("spec.runPolicy", {}),
        ("spec.runPolicy.suspend", False),
        ("spec.runPolicy.cleanPodPolicy", "All"),
        ("spec.scheduling", {}),
        ("spec.ps.replicas", 1),
        ("spec.chief.replicas", 1),
    ],
)
def test_server_side_defaults(path: str, default: Any) -> None:
    assert at(path)["default"] == default


def test_optional_fields_are_not_required_and_have_no_default() -> None:
    spec = at("spec")
    assert spec["required"] == ["chief", "ps", "worker", "checkpoint"]
    for name in ("image", "evaluator", "model"):
        assert "default" not in spec["properties"][name]
    assert "default" not in at("spec.runPolicy.activeDeadlineSeconds")
    assert at("spec.runPolicy.cleanPodPolicy")["enum"] == ["All", "Running", "None"]


def test_status_has_no_defaults() -> None:
    """The status shows what the operator wrote, nothing the apiserver filled in."""
    assert [p for p, n in walk(at("status")) if "default" in n] == []


def test_printer_columns_point_at_status_fields() -> None:
    [version] = crd.render_crd()["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert list(columns) == [
        "Phase", "PS", "Workers", "Restarts", "Step", "Age", "Checkpoint", "Checkpoint Age", "Last Failure",
        "Queue",
    ]  # fmt: skip
    # `kubectl get -o wide` only: the checkpoint, the last failure and the Kueue queue.
    assert [n for n, c in columns.items() if c.get("priority") == 1] == list(columns)[-4:]
    assert columns["Queue"]["jsonPath"] == r".metadata.labels.kueue\.x-k8s\.io/queue-name"
    for column in columns.values():
        if column["jsonPath"].startswith(".status."):
            field = at(column["jsonPath"].removeprefix("."))
            expected = {"string": "string", "integer": "integer", "date": "string"}[column["type"]]
            assert field["type"] == expected, column["name"]


def test_every_rule_message_names_its_field() -> None:
    for path, rules in crd_rules.VALIDATIONS.items():
        field = ".".join(p for p in path if p != "items")
        for rule in rules:
            named = field + (rule.field_path or "")
            assert rule.message.startswith(named or "metadata.name"), (named, rule.message)
            assert ": " in rule.message or "; " in rule.message, f"say why: {rule.message}"


def test_rules_inside_the_templates_live_only_under_bounded_lists() -> None:
    """CEL rules inside the upstream schemas are multiplied by the sizes of the lists above them,
    unbounded there: the templates' lists that hold rules are bounded, and no rule is in a volume."""
    for path, node in walk(openapi()):
        if "x-kubernetes-validations" not in node:
            continue
        assert ".volume." not in path, path
        if "template" in path.split("."):
            lists = [path[: m.start()] for m in re.finditer(re.escape("[]"), path)]
            assert all(at(p).get("maxItems") for p in lists), path


def test_the_ps_template_allows_only_its_containers_resources_to_change() -> None:
    """One rule per field that stays immutable, every field of the upstream schema but these."""
    pod = at("spec.ps.template.spec")
    container = pod["properties"]["containers"]["items"]
    frozen = {r["fieldPath"] for r in container["x-kubernetes-validations"]}
    assert set(container["properties"]) - {f.removeprefix(".") for f in frozen} == {"name"}
    assert {r["fieldPath"] for r in pod["x-kubernetes-validations"]} == {
        f".{name}" for name in pod["properties"] if name != "containers"
    }
    assert pod["properties"]["containers"]["maxItems"] == crd_rules.MAX_CONTAINERS


def test_size_is_well_under_the_etcd_and_annotation_limits() -> None:
    size = len(json.dumps(crd.render_crd(), separators=(",", ":")))
    # etcd rejects objects over 1.5 MiB; a client-side `kubectl apply` stores the whole object in
    # an annotation, which is limited to 256 KiB.
    assert size < 256 * 1024, f"CRD is {size} bytes"


def test_the_restarts_column_says_what_the_field_it_shows_holds() -> None:
    """It shows status.restarts (every coordinated restart), not status.countedRestarts (those
    counted against failurePolicy.maxRestarts, reset by a newer checkpoint)."""
    columns = crd.render_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    [restarts] = [c for c in columns if c["name"] == "Restarts"]
    assert restarts["jsonPath"] == ".status.restarts"
    field = openapi()["properties"]["status"]["properties"]["restarts"]
    assert restarts["description"] == field["description"]

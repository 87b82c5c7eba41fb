"""The upstream-schema extractor on a small OpenAPI document, and the committed files' freshness."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from psoperator.api.schemas import extract

REF = "#/components/schemas/"


def ref(name: str, **siblings: Any) -> dict[str, Any]:
    return {"allOf": [{"$ref": REF + name}], **siblings}


DEFINITIONS: dict[str, Any] = {
    "Pod": {
        "description": "A pod.",
        "type": "object",
        "properties": {
            "metadata": ref(extract.OBJECT_META, default={}),
            "containers": {
                "type": "array",
                "items": ref("Container", default={}),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "x-kubernetes-patch-merge-key": "name",
                "x-kubernetes-patch-strategy": "merge",
            },
            "hosts": {
                "type": "array",
                "items": ref("Host"),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["ip"],
            },
        },
        "required": ["containers"],
    },
    "Container": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "default": "", "description": "Name."},
            "port": ref(extract.INT_OR_STRING),
            "memory": ref(extract.QUANTITY),
            "uid": {"type": "string", "format": "uuid"},
            "count": {"type": "integer", "format": "int32", "default": 0},
            "ports": {
                "type": "array",
                "items": ref("Port", default={}),
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
            },
        },
        "required": ["name"],
    },
    "Port": {
        "type": "object",
        "properties": {
            "containerPort": {"type": "integer", "default": 0},
            "protocol": {"type": "string", "default": "TCP"},
        },
        "required": ["containerPort"],
    },
    "Host": {"type": "object", "properties": {"ip": {"type": "string"}}},
    extract.OBJECT_META: {
        "type": "object",
        "description": "Metadata.",
        "properties": {
            "name": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
        },
    },
    extract.INT_OR_STRING: {"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]},
    extract.QUANTITY: {"oneOf": [{"type": "string"}, {"type": "number"}]},
    "Loop": {"type": "object", "properties": {"next": ref("Loop")}},
    "Odd": {"type": "object", "x-kubernetes-something-new": True},
}


def pod(**options: Any) -> dict[str, Any]:
    return extract.structural_schema(DEFINITIONS, "Pod", **options)


def test_references_are_inlined_and_markers_dropped() -> None:
    text = json.dumps(pod())
    assert "$ref" not in text and "allOf" not in text and "patch" not in text
    container = pod()["properties"]["containers"]["items"]
    assert container["required"] == ["name"]
    assert container["properties"]["count"] == {"type": "integer", "format": "int32"}


def test_defaults_are_dropped_except_on_optional_list_map_keys() -> None:
    ports = pod()["properties"]["containers"]["items"]["properties"]["ports"]
    assert ports["x-kubernetes-list-map-keys"] == ["containerPort", "protocol"]
    assert ports["items"]["properties"]["protocol"]["default"] == "TCP"
    assert "default" not in ports["items"]["properties"]["containerPort"]
    assert "default" not in pod()["properties"]["containers"]["items"]["properties"]["name"]


def test_list_maps_with_optional_keys_become_atomic_lists() -> None:
    hosts = pod()["properties"]["hosts"]
    assert "x-kubernetes-list-type" not in hosts and "x-kubernetes-list-map-keys" not in hosts
    assert pod()["properties"]["containers"]["x-kubernetes-list-type"] == "map"


def test_int_or_string_and_quantity() -> None:
    container = pod()["properties"]["containers"]["items"]["properties"]
    assert container["port"] == {"x-kubernetes-int-or-string": True}
    memory = container["memory"]
    assert memory["x-kubernetes-int-or-string"] is True and "type" not in memory
    pattern = re.compile(memory["pattern"])
    for good in ("4Gi", "500m", "1", "0.5", "1e3", "+2k", ".5Mi", "100n"):
        assert pattern.match(good), good
    for bad in ("4Gx", "Gi", "1.2.3", "", "4 Gi", "1iB"):
        assert not pattern.match(bad), bad


def test_unknown_formats_are_dropped() -> None:
    assert "format" not in pod()["properties"]["containers"]["items"]["properties"]["uid"]


def test_object_meta_keeps_labels_and_annotations_only() -> None:
    metadata = pod()["properties"]["metadata"]
    assert set(metadata["properties"]) == {"labels", "annotations"}
    assert metadata["properties"]["labels"] == {"type": "object", "additionalProperties": {"type": "string"}}


def test_descriptions_only_when_asked() -> None:
    assert "description" not in json.dumps(pod())
    described = pod(keep_descriptions=True)
    assert described["description"] == "A pod."
    assert described["properties"]["containers"]["items"]["properties"]["name"]["description"] == "Name."


def test_omitted_fields_leave_properties_and_required() -> None:
    schema = pod(omit=("containers", "metadata.labels"))
    assert set(schema["properties"]) == {"metadata", "hosts"}
    assert "required" not in schema
    assert set(schema["properties"]["metadata"]["properties"]) == {"annotations"}
    with pytest.raises(extract.UpstreamSchemaError, match="no field"):
        pod(omit=("nope",))


def test_recursion_and_unknown_constructs_are_errors() -> None:
    with pytest.raises(extract.UpstreamSchemaError, match="recursive"):
        extract.structural_schema(DEFINITIONS, "Loop")
    with pytest.raises(extract.UpstreamSchemaError, match="unexpected keys"):
        extract.structural_schema(DEFINITIONS, "Odd")
    with pytest.raises(extract.UpstreamSchemaError, match="unknown definition"):
        extract.structural_schema(DEFINITIONS, "Missing")


def _cached_openapi() -> Path | None:
    go = shutil.which("go")
    if go is None:
        return None
    modcache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, check=False)
    path = (
        Path(modcache.stdout.strip())
        / f"k8s.io/kubernetes@{extract.KUBERNETES_VERSION}"
        / extract.OPENAPI_FILE
    )
    return path if path.exists() else None


def test_committed_schemas_match_the_upstream_document() -> None:
    """Runs where the k8s.io/kubernetes module is in the Go module cache (the e2e build puts it there)."""
    source = _cached_openapi()
    if source is None:
        missing = f"k8s.io/kubernetes@{extract.KUBERNETES_VERSION} is not in the Go module cache"
        if os.environ.get("CI"):
            pytest.fail(f"{missing}; e2e/cluster/cluster.sh build puts it there", pytrace=False)
        pytest.skip(missing)
    documents = extract.extract(json.loads(source.read_text()))
    for name, document in documents.items():
        committed = json.loads(extract.output_path(name).read_text())
        assert committed == document, f"{name}: regenerate with `python -m psoperator.api.schemas.extract`"

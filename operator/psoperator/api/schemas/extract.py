"""Extract flat, structural schemas of Kubernetes core types for the PSTrainingJob CRD.

A CRD cannot point at the apiserver's own definitions, so the pod templates and the checkpoint
volume carry a copy of the upstream schema, taken from the OpenAPI v3 document that ships in the
k8s.io/kubernetes module (api/openapi-spec/v3/api__v1_openapi.json). This module resolves its
$ref/allOf chains into one tree per type and removes what a CRD's structural schema rejects or what
would change objects behind the user's back:

- `default` values go, except on list-map keys that are neither required nor otherwise defaulted
  (a port's `protocol: TCP`): the apiserver needs those to key the list, and dropping every other
  default keeps stored templates exactly as written;
- `x-kubernetes-list-type: map` stays only where every key is required or defaulted;
- patch strategies, unions and group-version-kind markers go, and so do formats apiextensions does
  not know;
- IntOrString and Quantity become `x-kubernetes-int-or-string` (Quantity with a pattern);
- ObjectMeta is cut down to labels and annotations, the only metadata a pod template uses;
- descriptions go unless asked for: four pod templates with them would not fit in etcd's limit.

Run `python -m psoperator.api.schemas.extract` to regenerate the committed JSON files next to this
module, then `psoperator crd --write`.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

KUBERNETES_VERSION = "v1.35.4"
OPENAPI_FILE = "api/openapi-spec/v3/api__v1_openapi.json"
SCHEMA_DIR = Path(__file__).resolve().parent

# Upstream definition -> fields (dotted paths) left out of the embedded copy. The checkpoint volume
# is a Volume without its name: the operator names it. Ephemeral containers cannot be set when a pod
# is created, so a template has no use for them, and leaving them out keeps the CRD small enough
# for the last-applied annotation of a client-side `kubectl apply` (256 KiB).
EXTRACTED: dict[str, tuple[str, ...]] = {
    "io.k8s.api.core.v1.PodTemplateSpec": ("spec.ephemeralContainers",),
    "io.k8s.api.core.v1.Volume": ("name",),
}

INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
TEMPLATE_METADATA_FIELDS = ("labels", "annotations")

# The serialization grammar documented on resource.Quantity: a signed decimal number followed by
# a binary-SI suffix (Ki..Ei), a decimal-SI suffix (n, u, m, k, M..E) or a decimal exponent.
_NUMBER = r"([0-9]+(\.[0-9]*)?|\.[0-9]+)"
QUANTITY_PATTERN = rf"^[+-]?{_NUMBER}([KMGTPE]i|[numkMGTPE]|[eE][+-]?{_NUMBER})?$"

# Formats that apiextensions.k8s.io/v1 validates; the others are dropped.
ALLOWED_FORMATS = frozenset({"int32", "int64", "float", "double", "byte", "date", "date-time"})

# The value checks of a structural schema (apiextensions.k8s.io/v1 JSONSchemaProps).
VALUE_CHECKS = (
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
)

_COPIED = (
    "type",
    *VALUE_CHECKS,
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
)
_DROPPED = frozenset(
    {
        "x-kubernetes-patch-strategy",
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-unions",
        "x-kubernetes-group-version-kind",
    }
)
_HANDLED = frozenset(
    {"$ref", "allOf", "properties", "items", "additionalProperties", "required", "description"}
    | {"default", "format"}
)


class UpstreamSchemaError(ValueError):
    """The upstream document has a construct this extractor does not know how to flatten."""


def structural_schema(
    definitions: Mapping[str, Any],
    name: str,
    *,
    omit: Sequence[str] = (),
    keep_descriptions: bool = False,
) -> dict[str, Any]:
    """Return the flat structural schema of the upstream definition `name`, without `omit` fields."""
    flattener = _Flattener(definitions, keep_descriptions=keep_descriptions)
    schema = flattener.definition(name)
    for dotted in omit:
        *parents, field = dotted.split(".")
        node = schema
        for parent in parents:
            node = node["properties"][parent]
        if field not in node.get("properties", {}):
            raise UpstreamSchemaError(f"{name} has no field {dotted} to omit")
        del node["properties"][field]
        if field in node.get("required", []):
            node["required"] = [f for f in node["required"] if f != field]
            if not node["required"]:
                del node["required"]
    _settle_defaults(schema)
    return schema


class _Flattener:
    def __init__(self, definitions: Mapping[str, Any], *, keep_descriptions: bool) -> None:
        self._definitions = definitions
        self._keep_descriptions = keep_descriptions
        self._resolving: list[str] = []

    def definition(self, name: str) -> dict[str, Any]:
        if name in self._resolving:
            raise UpstreamSchemaError(f"recursive definition {' -> '.join([*self._resolving, name])}")
        if name == INT_OR_STRING:
            return {"x-kubernetes-int-or-string": True}
        if name == QUANTITY:
            return {
                "x-kubernetes-int-or-string": True,
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": QUANTITY_PATTERN,
            }
        if name not in self._definitions:
            raise UpstreamSchemaError(f"unknown definition {name}")
        self._resolving.append(name)
        try:
            if name == OBJECT_META:
                meta = self._definitions[name]
                return self.node(
                    {
                        "type": "object",
                        "description": meta.get("description", ""),
                        "properties": {f: meta["properties"][f] for f in TEMPLATE_METADATA_FIELDS},
                    }
                )
            return self.node(self._definitions[name])
        finally:
            self._resolving.pop()

    def node(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        unknown = set(schema) - set(_COPIED) - _DROPPED - _HANDLED
        if unknown:
            raise UpstreamSchemaError(f"unexpected keys {sorted(unknown)} in {dict(schema)}")
        refs = [schema["$ref"]] if "$ref" in schema else []
        refs += [part["$ref"] for part in schema.get("allOf", [])]
        if len(refs) > 1 or any(set(part) != {"$ref"} for part in schema.get("allOf", [])):
            raise UpstreamSchemaError(f"allOf other than a single $ref: {dict(schema)}")
        if refs:
            # A reference with siblings: the siblings (description, default) describe this use.
            out = copy.deepcopy(self.definition(refs[0].rsplit("/", 1)[-1]))
        else:
            out = {k: copy.deepcopy(schema[k]) for k in _COPIED if k in schema}
            if schema.get("format") in ALLOWED_FORMATS:
                out["format"] = schema["format"]
            if "properties" in schema:
                out["properties"] = {k: self.node(v) for k, v in schema["properties"].items()}
            if "items" in schema:
                out["items"] = self.node(schema["items"])
            additional = schema.get("additionalProperties")
            if isinstance(additional, Mapping):
                out["additionalProperties"] = self.node(additional)
            elif additional is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            if schema.get("required"):
                out["required"] = list(schema["required"])
        if self._keep_descriptions and schema.get("description"):
            out["description"] = schema["description"]
        else:
            out.pop("description", None)
        # Scalar defaults are kept until _settle_defaults decides which ones list-map keys need.
        if "default" in schema and not isinstance(schema["default"], dict | list):
            out["default"] = schema["default"]
        return out


def _settle_defaults(
    node: dict[str, Any], *, keep: bool = False, keep_properties: frozenset[str] = frozenset()
) -> None:
    """Drop every default except those of list-map keys; drop list-map types that lack them."""
    if not keep:
        node.pop("default", None)
    items = node.get("items")
    item_defaults: frozenset[str] = frozenset()
    if items is not None and node.get("x-kubernetes-list-type") == "map":
        properties = items.get("properties", {})
        optional = [
            k for k in node.get("x-kubernetes-list-map-keys", []) if k not in items.get("required", [])
        ]
        if all(k in properties and "default" in properties[k] for k in optional):
            item_defaults = frozenset(optional)
        else:
            # A list-map whose keys may be absent is not structural; it becomes an atomic list.
            del node["x-kubernetes-list-type"]
            node.pop("x-kubernetes-list-map-keys", None)
    for name, child in node.get("properties", {}).items():
        _settle_defaults(child, keep=name in keep_properties)
    if items is not None:
        _settle_defaults(items, keep_properties=item_defaults)
    if "additionalProperties" in node:
        _settle_defaults(node["additionalProperties"])


def output_path(name: str) -> Path:
    return SCHEMA_DIR / f"{name}.json"


def extract(openapi: Mapping[str, Any], *, keep_descriptions: bool = False) -> dict[str, dict[str, Any]]:
    """The documents written for every extracted definition, by definition name."""
    definitions = openapi["components"]["schemas"]
    return {
        name: {
            "source": f"k8s.io/kubernetes@{KUBERNETES_VERSION} {OPENAPI_FILE}",
            "definition": name,
            "omitted": list(omit),
            "schema": structural_schema(definitions, name, omit=omit, keep_descriptions=keep_descriptions),
        }
        for name, omit in EXTRACTED.items()
    }


def find_openapi() -> Path:
    """The OpenAPI document in the Go module cache, downloading the module if needed."""
    with tempfile.TemporaryDirectory() as scratch:
        result = subprocess.run(
            ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{KUBERNETES_VERSION}"],
            cwd=scratch,
            check=True,
            capture_output=True,
            text=True,
        )
    return Path(json.loads(result.stdout)["Dir"]) / OPENAPI_FILE


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--openapi", type=Path, help=f"path to {OPENAPI_FILE} (default: Go module cache)")
    parser.add_argument("--descriptions", action="store_true", help="keep upstream descriptions")
    args = parser.parse_args(argv)
    source: Path = args.openapi or find_openapi()
    openapi = json.loads(source.read_text())
    for name, document in extract(openapi, keep_descriptions=args.descriptions).items():
        path = output_path(name)
        path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path} ({path.stat().st_size} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

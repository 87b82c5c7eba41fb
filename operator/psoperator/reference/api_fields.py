"""docs/reference/api.md: every field of a PSTrainingJob, from the schema the CRD is made of.

The page is rendered from `crd.openapi_schema()`, the schema `psoperator crd` writes into the CRD
(itself generated from the models in api/models.py), so it shows what the API server enforces: each
field's type, default and description, its bounds, pattern and allowed values, and the CEL rules
with the message the API server answers. The pod templates and the checkpoint volume are upstream
Kubernetes types: the page links to their reference instead of repeating them, and lists the rules
the CRD adds inside them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psoperator import GROUP, KIND, VERSION
from psoperator.api import crd
from psoperator.api.crd_schema import UPSTREAM_MARKER, upstream_schema
from psoperator.api.models import POD_TEMPLATE, VOLUME_SOURCE
from psoperator.reference import escape

DOC_FILE = Path("docs/reference/api.md")

# The upstream types the CRD embeds, with the Kubernetes API reference that documents them.
UPSTREAM = {
    str(POD_TEMPLATE[UPSTREAM_MARKER]): (
        "PodTemplateSpec",
        "https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-template-v1/#PodTemplateSpec",
    ),
    str(VOLUME_SOURCE[UPSTREAM_MARKER]): (
        "Volume",
        "https://kubernetes.io/docs/reference/kubernetes-api/config-and-storage-resources/volume/#Volume",
    ),
}
OBJECT_META = "https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/object-meta/#ObjectMeta"

INTRO = f"""\
# API reference: `{KIND}`

<!-- Generated from operator/psoperator/api/models.py by `python -m psoperator.reference --write`. -->

`apiVersion: {GROUP}/{VERSION}`, `kind: {KIND}`, namespaced; short names
{", ".join(f"`{name}`" for name in crd.SHORT_NAMES)}. `kubectl explain psjob.spec` shows the same
descriptions. The API server itself checks every bound, pattern and rule below (no webhook), and
answers with the rule's message, which names the field; the [validation catalogue](validation.md) shows
each with the manifest that triggers it.

Each object has a section; a field whose type is an object links to its section. *Rules* are CEL
rules (`x-kubernetes-validations`); a rule on a field's parent that names the field is listed with
the parent.
"""


@dataclass
class Row:
    name: str
    type: str
    default: str
    description: str


@dataclass
class Section:
    path: str
    description: str
    rows: list[Row] = field(default_factory=list)
    rules: list[str] = field(default_factory=list)


def anchor(path: str) -> str:
    """The section's id: `spec.failurePolicy` -> spec-failurepolicy."""
    return re.sub(r"[^a-z0-9]+", "-", path.lower()).strip("-")


def _upstream(node: dict[str, Any]) -> tuple[str, str] | None:
    """The upstream type a node embeds (its fields are the upstream schema's), with its reference."""
    keys = set(node.get("properties", {}))
    for name, documented in UPSTREAM.items():
        if keys and keys == set(upstream_schema(name)["properties"]):
            return documented
    return None


def _rules(node: dict[str, Any]) -> list[str]:
    return [escape(rule["message"]) for rule in node.get("x-kubernetes-validations", [])]


def _rules_within(node: dict[str, Any]) -> Iterator[str]:
    """Every rule in an embedded upstream type, which the CRD adds to it (the PS template's)."""
    yield from _rules(node)
    for child in node.get("properties", {}).values():
        yield from _rules_within(child)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _rules_within(node[key])


def _range(low: int | None, high: int | None, unit: str) -> list[str]:
    if low is not None and low == high:
        return [f"only {low}{unit}"]
    if low == 1 and high is None and unit:
        return ["not empty"]
    if low is not None and high is not None:
        return [f"{low} to {high}{unit}"]
    if low is not None:
        return [f"at least {low}{unit}"]
    return [] if high is None else [f"at most {high}{unit}"]


def _sentence(text: str) -> str:
    return text if text.endswith((".", ")")) else f"{text}."


def _grouped(messages: list[str], path: str) -> list[str]:
    """Rules inside an upstream type, those that say the same of several fields said once: each
    message starts with the field it is about."""
    fields: dict[str, list[str]] = {}
    for message in messages:
        where, _, said = message.partition(" ")
        fields.setdefault(said, []).append(where.removeprefix(f"{path}."))
    return [
        f"`{where[0]}` {said}" if len(where) == 1 else f"{', '.join(f'`{w}`' for w in where)}: each {said}"
        for said, where in fields.items()
    ]


def _bounds(node: dict[str, Any]) -> list[str]:
    """The value checks of one node, in words."""
    out = []
    out += _range(node.get("minimum"), node.get("maximum"), "")
    out += _range(node.get("minLength"), node.get("maxLength"), " characters")
    if "maxItems" in node:
        out.append(f"at most {node['maxItems']} items")
    if "enum" in node:
        out.append("one of " + ", ".join(f"`{value}`" for value in node["enum"]))
    if "pattern" in node:
        out.append(f"matches `{node['pattern']}`")
    if node.get("x-kubernetes-list-type") == "set":
        out.append("no duplicates")
    return out


class _Walk:
    """Collects one section per object of the schema, depth first, in the schema's field order."""

    def __init__(self) -> None:
        self.sections: list[Section] = []

    def object(self, path: str, node: dict[str, Any]) -> None:
        section = Section(path, escape(node.get("description", "")), rules=_rules(node))
        self.sections.append(section)
        required = set(node.get("required", []))
        for name, child in node.get("properties", {}).items():
            section.rows.append(self.field(f"{path}.{name}", name, child, name in required))

    def field(self, path: str, name: str, node: dict[str, Any], required: bool) -> Row:
        sections = len(self.sections)
        kind = self.type(path, node)
        # An object's own rules are listed in its section.
        rules = _rules(node) if len(self.sections) == sections else []
        if _upstream(node) is not None:
            rules = _grouped(list(_rules_within(node)), path)
        checks = _bounds(node)
        items = node.get("items")
        if isinstance(items, dict):
            checks += [f"each: {check}" for check in _bounds(items)]
            rules += [f"each item: {message}" for message in _rules(items)]
        words = [escape(node.get("description", ""))]
        if checks:
            words.append("Valid: " + "; ".join(checks) + ".")
        words += [f"Rule: {_sentence(rule)}" for rule in rules]
        default = "required" if required else ""
        if "default" in node:
            default = f"`{json.dumps(node['default'], separators=(', ', ': '))}`"
        return Row(f"`{name}`", kind, default, " ".join(w for w in words if w))

    def type(self, path: str, node: dict[str, Any]) -> str:
        """The field's type, linking to the section of an object (walked now) or to upstream docs."""
        upstream = _upstream(node)
        if upstream is not None:
            return f"[{upstream[0]}]({upstream[1]})"
        kind = node.get("type")
        if kind == "array" and isinstance(node.get("items"), dict):
            return "[]" + self.type(f"{path}[]", node["items"])
        additional = node.get("additionalProperties")
        if kind == "object" and isinstance(additional, dict):
            return "map[string]" + self.type(f"{path}.*", additional)
        if kind == "object" and "properties" in node:
            self.object(path, node)
            return f"[object](#{anchor(path)})"
        if kind is None and node.get("x-kubernetes-preserve-unknown-fields"):
            return "any"
        return str(kind or "any")


def sections() -> list[Section]:
    """The job's top level first, then each object in the schema's order."""
    schema = crd.openapi_schema()
    walk = _Walk()
    top = Section(KIND, escape(schema["description"]), rules=_rules(schema))
    walk.sections.append(top)
    top.rows = [
        Row("`apiVersion`", "string", "required", f"`{GROUP}/{VERSION}`"),
        Row("`kind`", "string", "required", f"`{KIND}`"),
        Row("`metadata`", f"[ObjectMeta]({OBJECT_META})", "required", "The name, namespace and labels."),
        walk.field("spec", "spec", schema["properties"]["spec"], True),
        walk.field("status", "status", schema["properties"]["status"], False),
    ]
    return walk.sections


def render() -> str:
    parts = [INTRO]
    for section in sections():
        parts.append(f"\n## `{section.path}` {{#{anchor(section.path)}}}\n\n")
        if section.description:
            parts.append(f"{section.description}\n\n")
        parts.append("| field | type | default | description |\n|---|---|---|---|\n")
        parts += [f"| {r.name} | {r.type} | {r.default} | {r.description} |\n" for r in section.rows]
        if section.rules:
            parts.append("\nRules:\n\n" + "".join(f"- {_sentence(rule)}\n" for rule in section.rules))
    return "".join(parts)

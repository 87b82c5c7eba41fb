"""What the CRD's OpenAPI schema admits, offline: so that a harness judges the operator only on the
jobs and statuses the API server would store.

As the API server does for a custom resource: unknown fields are pruned (as a create without strict
field validation does), and so are nulls where the schema does not say nullable; then types,
required fields, enums, bounds, patterns and list uniqueness are checked. The CEL rules are not
(cel-python takes milliseconds a rule), so a harness also sees some objects the API server would
refuse: more than it must, never fewer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import Any

from psoperator.api import crd

Json = Any


class Refused(Exception):
    """The API server would refuse the object: where, and why."""


@cache
def root() -> dict[str, Any]:
    schema: dict[str, Any] = crd.render_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def stored(value: Json, schema: dict[str, Any], where: str = "") -> Json:
    """`value` as the API server would store it (pruned); Refused if it would refuse it."""
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise Refused(f"{where}: int or string")
        return value
    kind = schema.get("type")
    if kind is None:
        return value  # x-kubernetes-preserve-unknown-fields: anything
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63,
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and abs(v) < float("inf"),
    }
    if not checks[kind](value):
        raise Refused(f"{where}: not {kind}")
    if "enum" in schema and value not in schema["enum"]:
        raise Refused(f"{where}: not in enum")
    _bounds(value, schema, where)
    if kind == "object":
        return _object(value, schema, where)
    if kind == "array":
        items = [stored(v, schema.get("items", {}), f"{where}[{i}]") for i, v in enumerate(value)]
        _unique(items, schema, where)
        return items
    return value


def _bounds(value: Json, schema: dict[str, Any], where: str) -> None:
    size = len(value) if isinstance(value, str | list | dict) else None
    limits: tuple[tuple[str, Callable[[Any, Any], bool]], ...] = (
        ("minimum", lambda v, m: v >= m),
        ("maximum", lambda v, m: v <= m),
        ("minLength", lambda v, m: size is not None and size >= m),
        ("maxLength", lambda v, m: size is not None and size <= m),
        ("minItems", lambda v, m: size is not None and size >= m),
        ("maxItems", lambda v, m: size is not None and size <= m),
        ("minProperties", lambda v, m: size is not None and size >= m),
        ("maxProperties", lambda v, m: size is not None and size <= m),
    )
    for name, within in limits:
        if name in schema and not within(value, schema[name]):
            raise Refused(f"{where}: {name} {schema[name]}")
    if "pattern" in schema and not _pattern(schema["pattern"]).search(value):
        raise Refused(f"{where}: pattern")


@cache
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


def _object(value: dict[str, Any], schema: dict[str, Any], where: str) -> dict[str, Any]:
    properties, extra = schema.get("properties"), schema.get("additionalProperties")
    kept: dict[str, Any] = {}
    for key, child in value.items():
        if child is None and not schema.get("nullable"):
            continue  # pruned
        if properties is not None and key in properties:
            kept[key] = stored(child, properties[key], f"{where}.{key}")
        elif isinstance(extra, dict):
            kept[key] = stored(child, extra, f"{where}.{key}")
        elif schema.get("x-kubernetes-preserve-unknown-fields") or (properties is None and extra is None):
            kept[key] = child
    missing = [name for name in schema.get("required", []) if name not in kept]
    if missing:
        raise Refused(f"{where}: {missing} required")
    return kept


def _unique(items: list[Any], schema: dict[str, Any], where: str) -> None:
    kind = schema.get("x-kubernetes-list-type")
    if kind == "set":
        keys = [repr(i) for i in items]
    elif kind == "map":
        names = schema.get("x-kubernetes-list-map-keys", [])
        keys = [repr([i.get(n) for n in names]) for i in items]
    else:
        return
    if len(set(keys)) != len(keys):
        raise Refused(f"{where}: duplicate")

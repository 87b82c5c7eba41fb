"""The structural schema of a pydantic model, as a CRD takes it: $defs inlined, `X | None` as an
optional X (simply not required), defaults kept so the apiserver applies them, and the fields marked
`x-psoperator-upstream` (pod templates, the checkpoint volume) replaced by the upstream Kubernetes
schemas extracted into schemas/ (schemas/extract.py)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from psoperator.api.schemas.extract import VALUE_CHECKS

UPSTREAM_MARKER = "x-psoperator-upstream"


@cache
def upstream_schema(name: str) -> dict[str, Any]:
    """The extracted upstream schema for a `x-psoperator-upstream` marker (see schemas/extract.py)."""
    text = resources.files("psoperator.api.schemas").joinpath(f"{name}.json").read_text()
    document: dict[str, Any] = json.loads(text)
    return document["schema"]  # type: ignore[no-any-return]


# Keys of a pydantic JSON schema node that are carried into the CRD as they are.
_COPIED = ("type", "description", *VALUE_CHECKS, "format")
_IGNORED = frozenset({"title"})
_HANDLED = frozenset({"$ref", "anyOf", "properties", "required", "items", "additionalProperties"})


class CRDSchemaError(ValueError):
    """The models produced a JSON schema construct the CRD generator does not translate."""


class _CallDefaultFactories(GenerateJsonSchema):
    """Puts default_factory values into the schema, so the apiserver applies them too.

    A nested model's default becomes `{}`: the apiserver then fills in the model's own field
    defaults, which keeps each default written once.
    """

    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            value = factory()  # type: ignore[call-arg]
            return {} if isinstance(value, BaseModel) else value
        return super().get_default_value(schema)


def model_schema(model: type[BaseModel]) -> JsonSchemaValue:
    return model.model_json_schema(by_alias=True, schema_generator=_CallDefaultFactories)


def structural(model: type[BaseModel], *, defaults: bool) -> dict[str, Any]:
    """The CRD schema of a model: $defs inlined, `X | None` as optional X, upstream types embedded."""
    schema = model_schema(model)
    return _convert(schema, schema.get("$defs", {}), defaults=defaults)


def _convert(node: Mapping[str, Any], defs: Mapping[str, Any], *, defaults: bool) -> dict[str, Any]:
    node = dict(node)
    node.pop("$defs", None)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        # Siblings of a reference (description, default) describe this use of the type.
        return _convert({**target, **node}, defs, defaults=defaults)
    if "anyOf" in node:
        variants = [v for v in node.pop("anyOf") if v != {"type": "null"}]
        if len(variants) != 1:
            raise CRDSchemaError(f"only `X | None` unions are supported, got {variants}")
        if node.get("default", ...) is None:
            del node["default"]  # optional: simply not required
        return _convert({**variants[0], **node}, defs, defaults=defaults)
    unknown = set(node) - set(_COPIED) - _IGNORED - _HANDLED - {"default", UPSTREAM_MARKER}
    if unknown:
        raise CRDSchemaError(f"unexpected keys {sorted(unknown)} in {node}")
    if UPSTREAM_MARKER in node:
        embedded = copy.deepcopy(upstream_schema(node[UPSTREAM_MARKER]))
        embedded["description"] = node["description"]
        return embedded
    out = {key: node[key] for key in _COPIED if key in node}
    if defaults and node.get("default") is not None:
        out["default"] = node["default"]
    if "properties" in node:
        out["properties"] = {
            name: _convert(child, defs, defaults=defaults) for name, child in node["properties"].items()
        }
    if node.get("required"):
        out["required"] = list(node["required"])
    if "items" in node:
        out["items"] = _convert(node["items"], defs, defaults=defaults)
    additional = node.get("additionalProperties")
    if isinstance(additional, Mapping):
        out["additionalProperties"] = _convert(additional, defs, defaults=defaults)
    elif additional is True:
        out["x-kubernetes-preserve-unknown-fields"] = True
    # additionalProperties: false needs nothing: the apiserver prunes (or, strict, rejects) unknowns.
    return out


def at(schema: dict[str, Any], path: Sequence[str]) -> dict[str, Any]:
    node = schema
    for step in path:
        try:
            node = node["items"] if step == "items" else node["properties"][step]
        except KeyError:
            raise CRDSchemaError(f"no field {'.'.join(path)} in the schema (models.py changed?)") from None
    return node

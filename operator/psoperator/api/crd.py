"""The PSTrainingJob CustomResourceDefinition, generated from the typed models in models.py.

`render_crd()` turns the pydantic JSON schemas of PSTrainingJobSpec and PSTrainingJobStatus into a
structural apiextensions.k8s.io/v1 schema: $defs inlined, optional fields simply not required,
defaults kept so the apiserver applies them, pod templates and the checkpoint volume replaced by
the upstream Kubernetes schemas extracted into psoperator/schemas/. On top of the schema come the
CEL rules (`x-kubernetes-validations`) that check what one field's schema cannot: bounds with a
reason, the checkpoint dir's form, which fields are immutable after creation, and what of every
role's pod template is the operator's (the contract's environment, the names of the ports it
declares, no host network).

Immutable after creation: image, port, chief, the worker template and the PS template but its
containers' resources, evaluator, checkpoint, scheduling, model, failurePolicy.connectTimeoutSeconds
(it is in every pod's environment). Mutable: spec.ps.replicas, spec.worker.replicas and the
requests and limits of the PS containers (a live resize: policies/resize.py), all of
runPolicy (suspend, activeDeadlineSeconds, ttlSecondsAfterFinished, cleanPodPolicy) and the rest of
failurePolicy (maxRestarts, permanentExitCodes, workerPermanentExit, stallTimeoutSeconds,
schedulingTimeoutSeconds, startupErrorGraceSeconds, checkpointBeforeStopSeconds), which only the
operator reads.

`python -m psoperator.api.crd` prints the CRD; `--write` writes it into crds/ and the Helm chart.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from psoperator import GROUP, KIND, PLURAL, VERSION
from psoperator.api.models import (
    MAX_REPLICAS,
    MAX_WORKERS,
    POD_TEMPLATE,
    PSTrainingJobSpec,
    PSTrainingJobStatus,
)
from psoperator.api.schemas.extract import VALUE_CHECKS
from psoperator.contract import DEFAULT_PROGRESS_PORT, ENV_TF_CONFIG, INJECTED_PORT_NAMES, RESERVED_ENV_PREFIX

SINGULAR = "pstrainingjob"
SHORT_NAMES = ["psjob", "psjobs"]
CATEGORIES = ["psoperator"]
CRD_NAME = f"{PLURAL}.{GROUP}"

# A job's name prefixes its Services (<job>-<role>), StatefulSet pods (<job>-worker-<i>) and the
# StatefulSets' controller-revision-hash labels (<job>-worker-<10-char hash>), which must stay
# DNS-1035 labels of at most 63 characters.
MAX_JOB_NAME_LENGTH = 40

# Where the generated CRD is committed, relative to the repository root.
CRD_FILES = (
    Path("crds/psoperator.io_pstrainingjobs.yaml"),
    Path("charts/ps-training-operator/crds/psoperator.io_pstrainingjobs.yaml"),
)
HEADER = (
    "# Generated from operator/psoperator/api/models.py by `python -m psoperator.api.crd --write`;"
    " do not edit.\n"
)

UPSTREAM_MARKER = "x-psoperator-upstream"


@cache
def upstream_schema(name: str) -> dict[str, Any]:
    """The extracted upstream schema for a `x-psoperator-upstream` marker (see schemas/extract.py)."""
    text = resources.files("psoperator.api.schemas").joinpath(f"{name}.json").read_text()
    document: dict[str, Any] = json.loads(text)
    return document["schema"]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Rule:
    """One CEL rule; `message` names the field and says why."""

    rule: str
    message: str
    field_path: str | None = None

    def as_dict(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def _immutable_optional(field: str, why: str) -> Rule:
    """A transition rule on the parent: an optional field can be neither added, removed nor changed."""
    return Rule(
        f"has(self.{field}) == has(oldSelf.{field}) && "
        f"(!has(self.{field}) || self.{field} == oldSelf.{field})",
        why,
        field_path=f".{field}",
    )


def _replica_rules(role: str, maximum: int, what: str) -> list[Rule]:
    return [Rule(f"self >= 1 && self <= {maximum}", f"spec.{role}.replicas must be 1 to {maximum}: {what}")]


def _has_containers(role: str) -> Rule:
    """On a role: its template runs at least one container."""
    return Rule(
        "has(self.template) && has(self.template.spec) && size(self.template.spec.containers) > 0",
        f"spec.{role}.template.spec.containers must hold at least one container: the {role}'s "
        "training code runs in it",
        field_path=".template",
    )


def _template_rules(role: str) -> list[Rule]:
    """On a role: its template runs at least one container, and cannot change after creation."""
    return [
        _has_containers(role),
        _immutable_optional(
            "template",
            f"spec.{role}.template is immutable after creation: running pods would not follow it; delete "
            "and recreate the job (it resumes from its checkpoint)",
        ),
    ]


# The rules inside a pod template's lists run once per item, and the API server estimates a rule's
# cost times the most items it can run on: those lists are bounded, well beyond what a training
# container declares. With 16 containers, a PS container's string field's rule is estimated at half
# the API server's per-rule limit (32 would exceed it, no bound by 100 times); the rule on an env
# entry, with 1,024 of them, at a twentieth.
MAX_CONTAINERS = 16
MAX_CONTAINER_ENV = 1024
MAX_CONTAINER_PORTS = 128
ROLES = ("chief", "ps", "worker", "evaluator")


def _operator_owned(role: str) -> dict[tuple[str, ...], list[Rule]]:
    """In a role's template: what the operator sets in every training container (the contract's
    environment, the names of the ports it declares) is the operator's alone, and no pod is on the
    node's network, where the job's NetworkPolicies do not reach."""
    pod = ("spec", role, "template", "spec")
    where = ".".join(pod)
    ports = " or ".join(INJECTED_PORT_NAMES)
    return {
        pod: [
            Rule(
                "!has(self.hostNetwork) || !self.hostNetwork",
                f"{where}.hostNetwork must not be true: the job's NetworkPolicies do not reach the node's "
                "network, where its unauthenticated gRPC port would be served",
                field_path=".hostNetwork",
            )
        ],
        (*pod, "containers", "items", "env", "items"): [
            Rule(
                f"!(self.name == '{ENV_TF_CONFIG}' || self.name.startsWith('{RESERVED_ENV_PREFIX}'))",
                f"{where}.containers.env must not set {ENV_TF_CONFIG} or a {RESERVED_ENV_PREFIX} variable: "
                "the operator sets them",
            )
        ],
        (*pod, "containers", "items", "ports", "items"): [
            Rule(
                f"!has(self.name) || !(self.name in {_cel_strings(INJECTED_PORT_NAMES)})",
                f"{where}.containers.ports must not name a port {ports}: the operator declares the "
                f"task's gRPC port (spec.port) as {INJECTED_PORT_NAMES[0]} and the chief's progress "
                f"port ({DEFAULT_PROGRESS_PORT}) as {INJECTED_PORT_NAMES[1]}",
            )
        ],
    }


def _cel_strings(values: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _template_bounds(role: str) -> dict[tuple[str, ...], dict[str, Any]]:
    containers = ("spec", role, "template", "spec", "containers")
    return {
        containers: {"maxItems": MAX_CONTAINERS},
        (*containers, "items", "env"): {"maxItems": MAX_CONTAINER_ENV},
        (*containers, "items", "ports"): {"maxItems": MAX_CONTAINER_PORTS},
    }


# The resources (requests and limits) of the parameter servers' containers can change on a running
# job: a resize (policies/resize.py). Everything else of the PS template stays as it was created, one
# rule per field so that the API server's message names the field. The fields are read from the
# upstream schema, so a newer one is covered once it is extracted.
PS_TEMPLATE = ("spec", "ps", "template")
PS_CONTAINERS = (*PS_TEMPLATE, "spec", "containers")
_PS_RESIZABLE = "of the PS template, only the containers' resources can change"


def _pod_template_schema() -> dict[str, Any]:
    return upstream_schema(str(POD_TEMPLATE[UPSTREAM_MARKER]))


def _frozen_fields(path: tuple[str, ...], fields: Sequence[str]) -> list[Rule]:
    """Transition rules on `path`: each of `fields` can be neither added, removed nor changed."""
    where = ".".join(p for p in path if p != "items")
    return [
        _immutable_optional(name, f"{where}.{name} is immutable after creation: {_PS_RESIZABLE}")
        for name in fields
    ]


def _ps_template_rules() -> dict[tuple[str, ...], list[Rule]]:
    pod = _pod_template_schema()["properties"]["spec"]["properties"]
    container = pod["containers"]["items"]["properties"]
    claims = "(has({0}.resources) && has({0}.resources.claims) ? {0}.resources.claims : [])"
    where = ".".join(PS_CONTAINERS)
    return {
        PS_TEMPLATE: _frozen_fields(PS_TEMPLATE, ["metadata"]),
        (*PS_TEMPLATE, "spec"): _frozen_fields((*PS_TEMPLATE, "spec"), sorted(set(pod) - {"containers"})),
        PS_CONTAINERS: [
            Rule(
                "self.map(c, c.name) == oldSelf.map(c, c.name)",
                f"{where} cannot be added, removed, renamed or reordered after creation: {_PS_RESIZABLE}",
            )
        ],
        (*PS_CONTAINERS, "items"): [
            *_frozen_fields((*PS_CONTAINERS, "items"), sorted(set(container) - {"name", "resources"})),
            Rule(
                f"{claims.format('self')} == {claims.format('oldSelf')}",
                f"{where}.resources.claims is immutable after creation: {_PS_RESIZABLE}",
                field_path=".resources",
            ),
        ],
    }


def _images_rule(role: str) -> Rule:
    """On the spec: without spec.image, every container of the role's template names its own."""
    pod = f"self.{role}.template.spec"
    named = "all(c, has(c.image) && size(c.image) > 0)"
    rule = (
        f"has(self.image) || !has(self.{role}.template) || !has({pod}) || "
        f"({pod}.containers.{named} && (!has({pod}.initContainers) || {pod}.initContainers.{named}))"
    )
    if role == "evaluator":
        rule = f"!has(self.evaluator) || {rule}"
    return Rule(
        rule,
        f"spec.{role}.template: every container and init container needs an image when spec.image "
        "is not set; the pod could not be created",
        field_path=f".{role}.template",
    )


# CEL rules on the job's own fields, by location: a path of property names from the root schema,
# "items" stepping into a list.
_FIELD_RULES: dict[tuple[str, ...], list[Rule]] = {
    (): [
        Rule(
            f"size(self.metadata.name) <= {MAX_JOB_NAME_LENGTH} && "
            "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            f"metadata.name must be at most {MAX_JOB_NAME_LENGTH} characters of lowercase letters, "
            "digits and '-', starting with a letter and ending with a letter or digit: it prefixes the "
            "names of the job's Services and pods, which must be DNS labels",
        ),
    ],
    ("spec",): [
        _immutable_optional(
            "image",
            "spec.image is immutable after creation: running pods would keep the old image; delete "
            "and recreate the job to change it",
        ),
        _immutable_optional(
            "evaluator",
            "spec.evaluator cannot be added, removed or changed after creation; delete and recreate "
            "the job to change it",
        ),
        _immutable_optional(
            "model",
            "spec.model is immutable after creation: the parameter servers were sized for it",
        ),
        *(_images_rule(role) for role in ("chief", "ps", "worker", "evaluator")),
    ],
    ("spec", "port"): [
        Rule(
            "self >= 1 && self <= 65535",
            "spec.port must be a TCP port from 1 to 65535: every task serves gRPC on it",
        ),
        Rule(
            f"self != {DEFAULT_PROGRESS_PORT}",
            f"spec.port must not be {DEFAULT_PROGRESS_PORT}: the chief serves its progress report on that "
            "port (PSOP_PROGRESS_PORT)",
        ),
        Rule(
            "self == oldSelf",
            "spec.port is immutable after creation: every task's TF_CONFIG names it",
        ),
    ],
    ("spec", "chief"): _template_rules("chief"),
    ("spec", "chief", "replicas"): [
        Rule(
            "self == 1",
            "spec.chief.replicas must be 1: ParameterServerStrategy has exactly one chief, which "
            "coordinates the training",
        ),
    ],
    ("spec", "ps"): [_has_containers("ps")],  # its template: _ps_template_rules
    ("spec", "ps", "replicas"): _replica_rules(
        "ps",
        MAX_REPLICAS,
        "a job needs at least one parameter server to hold its variables",
    ),
    **_ps_template_rules(),
    ("spec", "worker"): _template_rules("worker"),
    ("spec", "worker", "replicas"): _replica_rules(
        "worker",
        MAX_WORKERS,
        "a job needs at least one worker to compute gradients",
    ),
    ("spec", "evaluator"): [_has_containers("evaluator")],  # immutable as a whole (a rule on spec)
    ("spec", "checkpoint"): [
        Rule(
            "self == oldSelf",
            "spec.checkpoint is immutable after creation: the job restores from and writes to it; "
            "delete and recreate the job to move its checkpoints",
        ),
        Rule(
            "!has(self.volume) || self.dir.startsWith('/')",
            "spec.checkpoint.volume needs spec.checkpoint.dir to be an absolute path: the volume is "
            "mounted at that path, and a gs:// or s3:// URI is not one",
            field_path=".volume",
        ),
        Rule(
            "!has(self.s3) || self.dir.startsWith('s3://')",
            "spec.checkpoint.s3 needs spec.checkpoint.dir to be an s3:// URI: it says how the pods "
            "reach that store",
            field_path=".s3",
        ),
    ],
    ("spec", "checkpoint", "dir"): [
        Rule(
            "self.startsWith('/') || self.matches('^(gs|s3|hdfs)://[^/]+')",
            "spec.checkpoint.dir must be an absolute path inside the pods (starting with /) or a "
            "gs:// or s3:// URI naming a bucket: a relative path would depend on each container's "
            "working directory",
        ),
        Rule(
            "!self.startsWith('hdfs://')",
            "spec.checkpoint.dir: hdfs:// is not supported: TensorFlow has no HDFS filesystem since "
            "2.6 (it moved to tensorflow-io, which has no release for this TensorFlow); use s3:// "
            "(any S3-compatible store), gs:// or a ReadWriteMany volume",
        ),
    ],
    ("spec", "checkpoint", "s3", "endpoint"): [
        Rule(
            "self.matches('^https?://[^/?#]+/?$')",
            "spec.checkpoint.s3.endpoint must be the store's URL, http://host[:port] or "
            "https://host[:port], without a path: the bucket comes from spec.checkpoint.dir",
        ),
    ],
    ("spec", "scheduling"): [
        Rule(
            "self == oldSelf",
            "spec.scheduling is immutable after creation: it is part of every pod's spec; delete "
            "and recreate the job to change it",
        ),
    ],
    ("spec", "failurePolicy", "connectTimeoutSeconds"): [
        Rule(
            "self == oldSelf",
            "spec.failurePolicy.connectTimeoutSeconds is immutable after creation: it is part of "
            "every pod's environment",
        ),
    ],
    ("spec", "failurePolicy", "permanentExitCodes", "items"): [
        Rule(
            "self >= 1 && self <= 255",
            "spec.failurePolicy.permanentExitCodes must hold exit codes from 1 to 255: 0 is success, "
            "and a process's exit code never exceeds 255",
        ),
    ],
}


def _merged(*tables: dict[tuple[str, ...], list[Rule]]) -> dict[tuple[str, ...], list[Rule]]:
    """Tables of rules by location as one: the rules of a location that several name, in order."""
    merged: dict[tuple[str, ...], list[Rule]] = {}
    for table in tables:
        for path, rules in table.items():
            merged.setdefault(path, []).extend(rules)
    return merged


# Every CEL rule of the CRD, by location.
VALIDATIONS = _merged(_FIELD_RULES, *(_operator_owned(role) for role in ROLES))

# Schema additions that the models cannot express, by the same kind of path.
OVERLAYS: dict[tuple[str, ...], dict[str, Any]] = {
    # Duplicates are rejected by the apiserver ("Duplicate value").
    ("spec", "failurePolicy", "permanentExitCodes"): {"x-kubernetes-list-type": "set"},
    **{path: bound for role in ROLES for path, bound in _template_bounds(role).items()},
    ("status", "conditions"): {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    # Records, or the "uid/restarts/..." strings of versions before them: an upgrade applies the CRD
    # first, and the previous operator goes on writing strings until the new one takes over (and
    # again after a rollback). The operator reads both (api/models.py, `_upgraded`).
    ("status", "tracking", "pods"): {"additionalProperties": {"x-kubernetes-preserve-unknown-fields": True}},
    # The operator's memory, written whole: the status write's managedFields names none of its
    # entries (11,000 pods' would be about 1 MiB).
    ("status", "tracking"): {"x-kubernetes-map-type": "atomic"},
    ("status", "tracking", "startErrors"): {
        "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True}
    },
}

PRINTER_COLUMNS: list[dict[str, str | int]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Phase of the job."},
    {
        "name": "PS",
        "type": "string",
        "jsonPath": ".status.psReady",
        "description": "Ready/desired parameter servers.",
    },
    {
        "name": "Workers",
        "type": "string",
        "jsonPath": ".status.workersReady",
        "description": "Ready/desired workers.",
    },
    {
        "name": "Restarts",
        "type": "integer",
        "jsonPath": ".status.restarts",
        # The field's own description: the column shows status.restarts, not the countedRestarts
        # that maxRestarts counts (and a newer checkpoint resets).
        "description": str(PSTrainingJobStatus.model_fields["restarts"].description),
    },
    {
        "name": "Step",
        "type": "integer",
        "jsonPath": ".status.step",
        "description": "Latest global step reported by the chief.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # Priority 1: shown by `kubectl get -o wide` only.
    {
        "name": "Checkpoint",
        "type": "integer",
        "jsonPath": ".status.checkpoint.step",
        "description": "Global step of the latest checkpoint.",
        "priority": 1,
    },
    {
        "name": "Checkpoint Age",
        "type": "date",
        "jsonPath": ".status.checkpoint.time",
        "description": "When the latest checkpoint was written.",
        "priority": 1,
    },
    {
        "name": "Last Failure",
        "type": "string",
        "jsonPath": ".status.lastFailure.summary",
        "description": "The task and the reason of the latest failure, e.g. ps-1 OOMKilled.",
        "priority": 1,
    },
    {
        "name": "Queue",
        "type": "string",
        "jsonPath": ".metadata.labels.kueue\\.x-k8s\\.io/queue-name",
        "description": "The Kueue LocalQueue the job waits in or was admitted from.",
        "priority": 1,
    },
]

ROOT_DESCRIPTION = (
    "PSTrainingJob runs a TensorFlow ParameterServerStrategy training job: one chief (the "
    "coordinator), parameter servers that hold the variables, workers that compute gradients and "
    "an optional evaluator, with TF_CONFIG set in every pod and recovery from checkpoints."
)

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


def _at(schema: dict[str, Any], path: Sequence[str]) -> dict[str, Any]:
    node = schema
    for step in path:
        try:
            node = node["items"] if step == "items" else node["properties"][step]
        except KeyError:
            raise CRDSchemaError(f"no field {'.'.join(path)} in the schema (models.py changed?)") from None
    return node


def openapi_schema() -> dict[str, Any]:
    """The version's openAPIV3Schema, with CEL rules and overlays applied."""
    schema: dict[str, Any] = {
        "type": "object",
        "description": ROOT_DESCRIPTION,
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "Versioned schema of this object: psoperator.io/v1alpha1.",
            },
            "kind": {"type": "string", "description": "PSTrainingJob."},
            "metadata": {"type": "object"},
            "spec": structural(PSTrainingJobSpec, defaults=True),
            "status": structural(PSTrainingJobStatus, defaults=False),
        },
        "required": ["spec"],
    }
    schema["properties"]["spec"]["description"] = "The desired job. Most fields are immutable after creation."
    schema["properties"]["status"]["description"] = "The observed state of the job, written by the operator."
    for path, overlay in OVERLAYS.items():
        _at(schema, path).update(copy.deepcopy(overlay))
    for path, rules in VALIDATIONS.items():
        _at(schema, path)["x-kubernetes-validations"] = [r.as_dict() for r in rules]
    return schema


def render_crd() -> dict[str, Any]:
    """The PSTrainingJob CustomResourceDefinition as a manifest."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": copy.deepcopy(PRINTER_COLUMNS),
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    """The committed form of the CRD: a header, then block-style YAML in the manifest's key order."""
    return HEADER + yaml.safe_dump(render_crd(), sort_keys=False, width=100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m psoperator.api.crd", description="Print the CRD.")
    parser.add_argument(
        "--write", action="store_true", help="write it to " + " and ".join(str(p) for p in CRD_FILES)
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[3],
        help="repository root for --write (default: the checkout this module is in)",
    )
    args = parser.parse_args(argv)
    text = render_crd_yaml()
    if not args.write:
        sys.stdout.write(text)
        return 0
    for relative in CRD_FILES:
        path = args.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path} ({len(text.encode())} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

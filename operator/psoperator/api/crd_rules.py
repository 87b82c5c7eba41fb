"""What the models' schemas cannot say of a PSTrainingJob: the CRD's CEL rules
(`x-kubernetes-validations`, VALIDATIONS) and its schema overlays (OVERLAYS), by location.

The rules check what one field's schema cannot: bounds with a reason, the checkpoint dir's form,
which fields are immutable after creation, and what of every role's pod template is the operator's
(the contract's environment, the names of the ports it declares, no host network).

Immutable after creation: image, port, chief, the worker template and the PS template but its
containers' resources, evaluator, checkpoint, scheduling, model, failurePolicy.connectTimeoutSeconds
(it is in every pod's environment). Mutable: spec.ps.replicas, spec.worker.replicas and the
requests and limits of the PS containers (a live resize: policies/resize.py), all of
runPolicy (suspend, activeDeadlineSeconds, ttlSecondsAfterFinished, cleanPodPolicy) and the rest of
failurePolicy (maxRestarts, permanentExitCodes, workerPermanentExit, stallTimeoutSeconds,
schedulingTimeoutSeconds, startupErrorGraceSeconds, checkpointBeforeStopSeconds), which only the
operator reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psoperator.api.crd_schema import UPSTREAM_MARKER, upstream_schema
from psoperator.api.models import MAX_REPLICAS, MAX_WORKERS, POD_TEMPLATE
from psoperator.contract import DEFAULT_PROGRESS_PORT, ENV_TF_CONFIG, INJECTED_PORT_NAMES, RESERVED_ENV_PREFIX

# A job's name prefixes its Services (<job>-<role>), StatefulSet pods (<job>-worker-<i>) and the
# StatefulSets' controller-revision-hash labels (<job>-worker-<10-char hash>), which must stay
# DNS-1035 labels of at most 63 characters.
MAX_JOB_NAME_LENGTH = 40


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


def template_bounds(role: str) -> dict[tuple[str, ...], dict[str, Any]]:
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
    **{path: bound for role in ROLES for path, bound in template_bounds(role).items()},
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

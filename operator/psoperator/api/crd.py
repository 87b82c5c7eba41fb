"""The PSTrainingJob CustomResourceDefinition, generated from the typed models in models.py.

`render_crd()` puts the structural schemas of PSTrainingJobSpec and PSTrainingJobStatus
(crd_schema.py) together with the CEL rules and overlays (crd_rules.py), the names and the printer
columns. `psoperator crd` prints it; `psoperator crd --write` writes it into crds/ and the Helm chart.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from psoperator import GROUP, KIND, PLURAL, VERSION
from psoperator.api.crd_rules import OVERLAYS, VALIDATIONS
from psoperator.api.crd_schema import at, structural
from psoperator.api.models import PSTrainingJobSpec, PSTrainingJobStatus

SINGULAR = "pstrainingjob"
SHORT_NAMES = ["psjob", "psjobs"]
CATEGORIES = ["psoperator"]
CRD_NAME = f"{PLURAL}.{GROUP}"

# Where the generated CRD is committed, relative to the repository root.
CRD_FILES = (
    Path("crds/psoperator.io_pstrainingjobs.yaml"),
    Path("charts/ps-training-operator/crds/psoperator.io_pstrainingjobs.yaml"),
)
ROOT = Path(__file__).resolve().parents[3]  # the checkout this module is in
HEADER = "# Generated from operator/psoperator/api/models.py by `psoperator crd --write`; do not edit.\n"

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
        at(schema, path).update(copy.deepcopy(overlay))
    for path, rules in VALIDATIONS.items():
        at(schema, path)["x-kubernetes-validations"] = [r.as_dict() for r in rules]
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


def main(*, write: bool) -> int:
    """Print the CRD, or write it into CRD_FILES of the checkout (`psoperator crd [--write]`)."""
    text = render_crd_yaml()
    if not write:
        sys.stdout.write(text)
        return 0
    for relative in CRD_FILES:
        path = ROOT / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path} ({len(text.encode())} bytes)", file=sys.stderr)
    return 0

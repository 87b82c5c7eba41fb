"""The spec, through the models to the renderer: what the operator makes of what a user writes.

Promised: any spec the CRD's schema admits is either refused by the models (the job then gets a
condition naming the field: plan/stages.py) or renders its children without an exception, as
objects the API server can take (JSON, integers within 64 bits), the same on a second render.
e2e/test_render_dry_run.py sends the children of such specs to a real API server (dry run).
"""

from __future__ import annotations

import copy
from typing import Any

import atheris
from pydantic import ValidationError

from psoperator.api.models import PSTrainingJobSpec
from psoperator.contract import Role
from psoperator.render import RenderOptions, render_children
from tests.fuzz import schema, seeds
from tests.fuzz.invariants import writable
from tests.fuzz.mutate import Vocabulary, mutated, pick

SEEDS = seeds.specs()
WORDS = Vocabulary.of(*SEEDS)
SCHEMA = schema.root()["properties"]["spec"]
OPTIONS = (RenderOptions(), RenderOptions(queue="team-a", priority=("high", 1000), attempt=3))


def job_of(spec: dict[str, Any], namespace: str = seeds.NS) -> dict[str, Any]:
    metadata = {"name": seeds.JOB, "namespace": namespace, "uid": "job-uid", "generation": 1}
    return {
        "apiVersion": "psoperator.io/v1alpha1",
        "kind": "PSTrainingJob",
        "metadata": metadata,
        "spec": spec,
    }


def admitted_spec(fdp: Any, templates_kept: bool = False) -> dict[str, Any] | None:
    """A seed spec with the edits the bytes choose, as the API server stores it, if the CRD's schema
    admits it and the models accept it; else None. `templates_kept`: the pod templates are the
    seed's (the CRD keeps them whole, and the API server's pod validation is not the operator's)."""
    seed = pick(fdp, SEEDS)
    spec = mutated(seed, fdp, WORDS)
    if templates_kept and isinstance(spec, dict):
        for role in Role:
            if isinstance(spec.get(role.value), dict) and "template" in seed.get(role.value, {}):
                spec[role.value]["template"] = copy.deepcopy(seed[role.value]["template"])
    try:
        stored: dict[str, Any] = schema.stored(spec, SCHEMA, "spec")
        PSTrainingJobSpec.model_validate(stored)
    except (schema.Refused, ValidationError):
        return None
    return stored


def TestOneInput(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    spec = admitted_spec(fdp)
    if spec is None:
        return
    job, options = job_of(spec), pick(fdp, OPTIONS)
    children = render_children(job, options)
    for child in children:
        writable(child, f"{child['kind']}/{child['metadata']['name']}")
    assert render_children(job, options) == children

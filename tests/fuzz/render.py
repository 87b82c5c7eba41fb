"""The spec, through the models to the renderer: what the operator makes of what a user writes.

Promised: any spec the CRD's schema admits is either refused by the models (the job then gets a
condition naming the field: plan/stages.py) or renders its children without an exception, as
objects the API server can take (JSON, integers within 64 bits), the same on a second render.
"""

from __future__ import annotations

from typing import Any

import atheris
from pydantic import ValidationError

from psoperator.api.models import PSTrainingJobSpec
from psoperator.render import RenderOptions, render_children
from tests.fuzz import schema, seeds
from tests.fuzz.invariants import writable
from tests.fuzz.mutate import Vocabulary, mutated, pick

SEEDS = seeds.specs()
WORDS = Vocabulary.of(*SEEDS)
SCHEMA = schema.root()["properties"]["spec"]
OPTIONS = (RenderOptions(), RenderOptions(queue="team-a", priority=("high", 1000), attempt=3))
JOB = {
    "apiVersion": "psoperator.io/v1alpha1",
    "kind": "PSTrainingJob",
    "metadata": {"name": seeds.JOB, "namespace": seeds.NS, "uid": "job-uid", "generation": 1},
}


def TestOneInput(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    try:
        spec: Any = schema.stored(mutated(pick(fdp, SEEDS), fdp, WORDS), SCHEMA, "spec")
    except schema.Refused:
        return
    try:
        PSTrainingJobSpec.model_validate(spec)
    except ValidationError:
        return
    job = {**JOB, "spec": spec}
    options = pick(fdp, OPTIONS)
    children = render_children(job, options)
    for child in children:
        writable(child, f"{child['kind']}/{child['metadata']['name']}")
    assert render_children(job, options) == children

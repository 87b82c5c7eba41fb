"""The children of specs the fuzzer makes (tests/fuzz/render.py), sent to a real API server with a
dry run: any spec the CRD's schema admits and the models accept renders children the API server
takes. The pod templates are the seeds' own: the CRD keeps a template whole, and what the API
server's pod validation refuses in one (a containerPort of 99999) is the ChildRejected Warning's."""

from __future__ import annotations

import json
import random
from typing import Any

import atheris
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from psoperator.render import render_children
from tests.fuzz.render import admitted_spec, job_of

pytestmark = pytest.mark.cluster

SPECS = 60  # specs the models accept; at least half of them the CRD's CEL rules admit too


def _specs() -> list[dict[str, Any]]:
    """The first SPECS admitted specs of a fixed sequence of random inputs."""
    found: list[dict[str, Any]] = []
    rng = random.Random(1)
    while len(found) < SPECS:
        spec = admitted_spec(atheris.FuzzedDataProvider(rng.randbytes(256)), templates_kept=True)
        if spec is not None:
            found.append(spec)
    return found


def _refusal(api: DynamicClient, obj: dict[str, Any], namespace: str) -> str | None:
    """Why the API server refuses to create the object (a dry run); None if it takes it."""
    resource = api.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    try:
        resource.create(body=obj, namespace=namespace, query_params=[("dryRun", "All")])
    except ApiException as error:
        return str(json.loads(error.body or "{}").get("message", error.reason))
    return None


def test_every_child_of_an_admitted_spec_is_taken_by_the_api_server(
    k8s: client.ApiClient, namespace: str, crd: str
) -> None:
    api, admitted, refused = DynamicClient(k8s), 0, []  # type: ignore[no-untyped-call]
    for spec in _specs():
        job = job_of(spec, namespace)
        if _refusal(api, job, namespace) is not None:  # a CEL rule of the CRD refuses it
            continue
        admitted += 1
        for child in render_children(job):
            why = _refusal(api, child, namespace)
            if why is not None:
                refused.append(f"{child['kind']}: {why}")
    assert admitted >= SPECS // 2
    assert not refused, sorted(set(refused))

"""Properties of the renderers over many job shapes: what must hold whatever the spec."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from psoperator.render import RenderOptions, render_children
from tests.unit.builders import job

names = st.from_regex(r"[a-z]([a-z0-9-]{0,38}[a-z0-9])?", fullmatch=True)
shapes = st.fixed_dictionaries(
    {
        "name": names,
        "ps": st.integers(1, 20),
        "workers": st.integers(1, 40),
        "port": st.integers(1, 65535),
        "attempt": st.integers(0, 1000),
        "evaluator": st.booleans(),
    }
)


def _render(shape: dict[str, Any]) -> list[dict[str, Any]]:
    spec: dict[str, Any] = {
        "port": shape["port"],
        "ps": {"replicas": shape["ps"]},
        "worker": {"replicas": shape["workers"]},
    }
    if shape["evaluator"]:
        spec["evaluator"] = {"template": {"spec": {"containers": [{"name": "e"}]}}}
    obj = job(**spec)
    obj["metadata"]["name"] = shape["name"]
    return render_children(obj, RenderOptions(attempt=shape["attempt"]))


def _tf_config(manifest: dict[str, Any], index: int) -> dict[str, Any]:
    env = manifest["spec"]["template"]["spec"]["containers"][0]["env"]
    value = next(e["value"] for e in env if e["name"] == "TF_CONFIG")
    parsed: dict[str, Any] = json.loads(value.replace("$(PSOP_TASK_INDEX)", str(index)))
    return parsed


@settings(max_examples=150, deadline=None)
@given(shapes)
def test_rendering_is_deterministic_and_every_task_is_addressed_once(shape: dict[str, Any]) -> None:
    first, second = _render(shape), _render(shape)
    assert first == second
    sets = {m["metadata"]["name"]: m for m in first if m["kind"] == "StatefulSet"}
    chief = next(m for m in first if m["kind"] == "Job" and m["metadata"]["name"].endswith("-chief"))
    cluster = _tf_config(chief, 0)["cluster"]
    assert [len(cluster[r]) for r in ("chief", "ps", "worker")] == [1, shape["ps"], shape["workers"]]
    addresses = [a for role in cluster.values() for a in role]
    assert len(set(addresses)) == len(addresses)
    assert all(a.endswith(f":{shape['port']}") for a in addresses)
    for role, count in (("ps", shape["ps"]), ("worker", shape["workers"])):
        sts = sets[f"{shape['name']}-{role}"]
        for index in range(count):
            config = _tf_config(sts, index)
            assert config["cluster"] == cluster
            assert config["task"] == {"type": role, "index": index}
            # The task's own address is its pod's stable DNS name through the role's headless Service.
            host = f"{shape['name']}-{role}-{index}.{sts['spec']['serviceName']}."
            assert cluster[role][index].startswith(host)


@settings(max_examples=150, deadline=None)
@given(shapes)
def test_every_name_and_label_fits_kubernetes_limits(shape: dict[str, Any]) -> None:
    for manifest in _render(shape):
        meta = manifest["metadata"]
        assert len(meta["name"]) <= 63
        # StatefulSet pods add "-<ordinal>"; the controller-revision-hash label adds "-<10 chars>".
        if manifest["kind"] == "StatefulSet":
            assert len(meta["name"]) + 11 <= 63
        for value in meta["labels"].values():
            assert len(value) <= 63
        template = manifest.get("spec", {}).get("template")
        if template is not None:
            hostname = template["spec"].get("hostname", meta["name"] + "-0")
            assert len(hostname) <= 63

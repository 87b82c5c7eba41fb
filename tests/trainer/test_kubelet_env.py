"""The test kit's kubelet: env and argument expansion as Kubernetes does it, on the real renderer's output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tfcluster.jobs import ctr_job
from tfcluster.kubelet import (
    PodFacts,
    container_argv,
    expand,
    field_ref,
    job_pod,
    pod_fqdn,
    resolve_env,
    statefulset_pod,
)

from psoperator.render import render_children

VARS = {"A": "alpha", "EMPTY": ""}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        ("$(A)", "alpha"),
        ("x-$(A)-y", "x-alpha-y"),
        ("$(EMPTY)|", "|"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$alpha"),
        ("$$", "$"),
        ("$A", "$A"),
        ("$(A", "$(A"),
        ("a$", "a$"),
        ("$()", "$()"),
        ("$(A)$(A)", "alphaalpha"),
    ],
)
def test_expand_follows_kubernetes_syntax(text: str, expected: str) -> None:
    assert expand(text, VARS.get) == expected


def test_env_resolves_in_order_and_field_refs_are_not_expanded() -> None:
    container = {
        "env": [
            {"name": "LATER_REF", "value": "$(FIRST)"},
            {"name": "FIRST", "value": "one"},
            {"name": "SECOND", "value": "$(FIRST)-two"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "NOLABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['nope']"}}},
            {"name": "BLANK"},
            {"name": "USES_POD", "value": "$(POD)/$(SVC_HOST)"},
        ],
        "args": ["--name=$(POD)", "$$(POD)", "$(UNDEFINED)"],
    }
    pod = PodFacts(name="p-$(FIRST)", namespace="ns", labels={"app": "web"})
    env = resolve_env(container, pod, service_env={"SVC_HOST": "10.0.0.1"})
    assert env == {
        "LATER_REF": "$(FIRST)",
        "FIRST": "one",
        "SECOND": "one-two",
        "POD": "p-$(FIRST)",
        "LABEL": "web",
        "NOLABEL": "",
        "BLANK": "",
        "USES_POD": "p-$(FIRST)/10.0.0.1",
    }
    assert container_argv(container, env, ["/entry"]) == [
        "/entry",
        "--name=p-$(FIRST)",
        "$(POD)",
        "$(UNDEFINED)",
    ]


def test_a_secret_key_is_resolved_from_the_namespaces_secrets() -> None:
    container = {"env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    assert resolve_env(container, PodFacts("p", "n"), secrets={"s": {"k": "v"}}) == {"S": "v"}
    with pytest.raises(KeyError):  # as a kubelet refuses to start it: the Secret is missing
        resolve_env(container, PodFacts("p", "n"))


def test_unsupported_sources_are_refused() -> None:
    with pytest.raises(NotImplementedError):
        resolve_env(
            {"env": [{"name": "C", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]},
            PodFacts("p", "n"),
        )
    with pytest.raises(KeyError):
        field_ref(PodFacts("p", "n"), "spec.containers")


def _children() -> dict[tuple[str, str], dict[str, Any]]:
    job = ctr_job(Path("/ckpt"), ["--steps=10"])
    return {(c["kind"], c["metadata"]["name"]): c for c in render_children(job)}


def test_statefulset_pod_gets_its_own_index_in_tf_config() -> None:
    children = _children()
    pod, template = statefulset_pod(children[("StatefulSet", "ctr-ps")], 1)
    env = resolve_env(template["spec"]["containers"][0], pod)
    config = json.loads(env["TF_CONFIG"])
    assert config["task"] == {"type": "ps", "index": 1}
    assert (env["PSOP_ROLE"], env["PSOP_TASK_INDEX"], env["PSOP_POD_NAME"]) == ("ps", "1", "ctr-ps-1")
    assert env["PSOP_NAMESPACE"] == "team-a" and env["PSOP_CHECKPOINT_DIR"] == "/ckpt"
    assert pod_fqdn(pod, template) == "ctr-ps-1.ctr-ps.team-a.svc.cluster.local"
    assert f"{pod_fqdn(pod, template)}:2222" == config["cluster"]["ps"][1]


def test_chief_job_pod_is_reachable_at_the_address_in_tf_config() -> None:
    children = _children()
    pod, template = job_pod(children[("Job", "ctr-chief")])
    container = template["spec"]["containers"][0]
    env = resolve_env(container, pod)
    config = json.loads(env["TF_CONFIG"])
    assert config["task"] == {"type": "chief", "index": 0}
    assert f"{pod_fqdn(pod, template)}:2222" == config["cluster"]["chief"][0]
    assert env["PSOP_POD_NAME"] == pod.name != pod_fqdn(pod, template).split(".")[0]
    argv = container_argv(container, env, ["pstrainer"])
    assert argv[:2] == ["pstrainer", "--steps=10"]

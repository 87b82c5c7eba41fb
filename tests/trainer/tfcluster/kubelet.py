"""What the kubelet does to a container's environment and arguments before it starts it.

Environment entries are resolved in order: `value` gets `$(VAR)` references expanded against the
entries before it (then the service-link variables), `valueFrom.fieldRef` reads the pod's own
metadata (downward API) and is never expanded. `command` and `args` are then expanded against the
final environment. `$$` is an escaped `$`; a reference to an unknown variable stays as written.
This mirrors Kubernetes' third_party/forked/golang/expansion and the kubelet's
makeEnvironmentVariables.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Manifest = dict[str, Any]


@dataclass(frozen=True)
class PodFacts:
    """What the API server knows about a pod when its containers start."""

    name: str
    namespace: str
    uid: str = "00000000-0000-0000-0000-000000000000"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_name: str = "node-0"
    service_account_name: str = "default"
    pod_ip: str = ""
    host_ip: str = ""


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes `$(VAR)` expansion of one string."""
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "$" or i + 1 == len(text):
            out.append(char)
            i += 1
            continue
        following = text[i + 1]
        if following == "$":
            out.append("$")
            i += 2
        elif following == "(":
            close = text.find(")", i + 2)
            if close == -1:
                # An unterminated reference is kept as it is.
                out.append("$(")
                i += 2
            else:
                name = text[i + 2 : close]
                value = lookup(name)
                out.append(f"$({name})" if value is None else value)
                i = close + 1
        else:
            out.append("$" + following)
            i += 2
    return "".join(out)


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")


def field_ref(pod: PodFacts, path: str) -> str:
    """The downward-API value of a fieldRef path; KeyError for a path the API server would refuse."""
    simple = {
        "metadata.name": pod.name,
        "metadata.namespace": pod.namespace,
        "metadata.uid": pod.uid,
        "spec.nodeName": pod.node_name,
        "spec.serviceAccountName": pod.service_account_name,
        "status.podIP": pod.pod_ip,
        "status.podIPs": pod.pod_ip,
        "status.hostIP": pod.host_ip,
        "status.hostIPs": pod.host_ip,
    }
    if path in simple:
        return simple[path]
    match = _SUBSCRIPT.match(path)
    if match:
        source = pod.labels if match.group(1) == "labels" else pod.annotations
        # A missing label or annotation resolves to an empty string.
        return source.get(match.group(2), "")
    raise KeyError(f"unsupported fieldRef {path!r}")


def resolve_env(
    container: Manifest,
    pod: PodFacts,
    service_env: Mapping[str, str] | None = None,
    secrets: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """The environment the container's process sees (only what the pod spec defines); `secrets`
    are the namespace's Secrets by name, their keys decoded."""
    if container.get("envFrom"):
        raise NotImplementedError("envFrom is not simulated")
    resolved: dict[str, str] = {}
    services = dict(service_env or {})

    def lookup(name: str) -> str | None:
        if name in resolved:
            return resolved[name]
        return services.get(name)

    for entry in container.get("env", []):
        name = entry["name"]
        if entry.get("value"):
            resolved[name] = expand(entry["value"], lookup)
        elif "valueFrom" in entry:
            source = entry["valueFrom"]
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                resolved[name] = (secrets or {})[ref["name"]][ref["key"]]
                continue
            if "fieldRef" not in source:
                raise NotImplementedError(f"env {name}: only fieldRef and secretKeyRef are simulated")
            resolved[name] = field_ref(pod, source["fieldRef"]["fieldPath"])
        else:
            resolved[name] = ""
    return resolved


def container_argv(container: Manifest, env: Mapping[str, str], entrypoint: list[str]) -> list[str]:
    """command (or the image's entrypoint) plus args, each expanded against the environment."""

    def lookup(name: str) -> str | None:
        return env.get(name)

    command = [expand(part, lookup) for part in container.get("command", [])] or list(entrypoint)
    return command + [expand(part, lookup) for part in container.get("args", [])]


def statefulset_pod(statefulset: Manifest, ordinal: int) -> tuple[PodFacts, Manifest]:
    """The pod the StatefulSet controller makes for an ordinal: name, hostname, controller labels."""
    name = f"{statefulset['metadata']['name']}-{ordinal}"
    template = statefulset["spec"]["template"]
    labels = {
        **template.get("metadata", {}).get("labels", {}),
        "statefulset.kubernetes.io/pod-name": name,
        "apps.kubernetes.io/pod-index": str(ordinal),
        "controller-revision-hash": f"{statefulset['metadata']['name']}-5d8f7c9b4",
    }
    pod = PodFacts(
        name=name,
        namespace=statefulset["metadata"]["namespace"],
        labels=labels,
        annotations=dict(template.get("metadata", {}).get("annotations", {})),
    )
    return pod, template


def job_pod(job: Manifest, suffix: str = "x7k2p") -> tuple[PodFacts, Manifest]:
    """A pod of a batch/v1 Job: generated name, the Job controller's labels (and index if Indexed)."""
    job_name = job["metadata"]["name"]
    template = job["spec"]["template"]
    labels = {
        **template.get("metadata", {}).get("labels", {}),
        "batch.kubernetes.io/job-name": job_name,
        "job-name": job_name,
        "batch.kubernetes.io/controller-uid": "11111111-2222-3333-4444-555555555555",
        "controller-uid": "11111111-2222-3333-4444-555555555555",
    }
    annotations = dict(template.get("metadata", {}).get("annotations", {}))
    name = f"{job_name}-{suffix}"
    if job["spec"].get("completionMode") == "Indexed":
        labels["batch.kubernetes.io/job-completion-index"] = "0"
        annotations["batch.kubernetes.io/job-completion-index"] = "0"
        name = f"{job_name}-0-{suffix}"
    pod = PodFacts(name=name, namespace=job["metadata"]["namespace"], labels=labels, annotations=annotations)
    return pod, template


def pod_fqdn(pod: PodFacts, template: Manifest, cluster_domain: str = "cluster.local") -> str:
    """`<hostname>.<subdomain>.<namespace>.svc.<domain>`: the DNS name a headless Service gives a pod."""
    spec = template.get("spec", {})
    hostname = spec.get("hostname") or pod.name
    subdomain = spec.get("subdomain")
    if not subdomain:
        return hostname
    return f"{hostname}.{subdomain}.{pod.namespace}.svc.{cluster_domain}"

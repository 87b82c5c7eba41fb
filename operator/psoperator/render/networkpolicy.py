"""NetworkPolicies: TensorFlow's gRPC has no authentication, so a job's pods take connections only
from the job's own pods, and the chief's progress port only from the operator's own pods (its
namespace and its pods' labels; the namespace alone when the operator is not told its labels).

Policies only allow: the job's pods accept nothing else (egress is left alone), and a user who
needs more (TensorBoard, a metrics scrape) adds a policy of their own, which adds to these. Traffic
from a pod's own node is never blocked by a NetworkPolicy (kubelet probes; an operator run out of
cluster reaches only the chief's of its node). No policy isolates a pod on the node's network: the
CRD refuses hostNetwork in the templates. The policies exist before any pod (plan/children.py).
"""

from __future__ import annotations

from psoperator.api.labels import LABEL_JOB
from psoperator.api.names import child_name, job_labels, selector_labels
from psoperator.contract import Role
from psoperator.render.pod import Manifest

# The label every namespace carries with its own name (Kubernetes >= 1.22).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
COMPONENT = "network-policy"


def _policy(
    job_name: str, namespace: str, name: str, selected: dict[str, str], ingress: list[Manifest]
) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": job_labels(job_name, COMPONENT)},
        "spec": {
            "podSelector": {"matchLabels": selected},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _tcp(port: int) -> list[Manifest]:
    return [{"protocol": "TCP", "port": port}]


def _peers_name(job_name: str) -> str:
    return f"{job_name}-peers"


def _progress_name(job_name: str) -> str:
    return f"{child_name(job_name, Role.CHIEF)}-progress"


def policy_names(job_name: str, operator_namespace: str | None) -> list[str]:
    """The names of the job's NetworkPolicies, as `render_network_policies` makes them."""
    return [_peers_name(job_name), *([_progress_name(job_name)] if operator_namespace else [])]


def render_network_policies(
    job_name: str,
    namespace: str,
    port: int,
    progress_port: int,
    operator_namespace: str | None,
    operator_pod_labels: tuple[tuple[str, str], ...] = (),
) -> list[Manifest]:
    """The peers' policy and, where the operator has a namespace of its own, the progress port's."""
    policies = [render_peer_policy(job_name, namespace, port)]
    if operator_namespace:
        progress = render_progress_policy(
            job_name, namespace, progress_port, operator_namespace, operator_pod_labels
        )
        policies.append(progress)
    return policies


def render_peer_policy(job_name: str, namespace: str, port: int) -> Manifest:
    """Every pod of the job (chief, PS, workers, evaluator) takes the gRPC port from the job's pods only."""
    ingress = [{"from": [{"podSelector": {"matchLabels": {LABEL_JOB: job_name}}}], "ports": _tcp(port)}]
    return _policy(job_name, namespace, _peers_name(job_name), {LABEL_JOB: job_name}, ingress)


def render_progress_policy(
    job_name: str,
    namespace: str,
    progress_port: int,
    operator_namespace: str,
    operator_pod_labels: tuple[tuple[str, str], ...] = (),
) -> Manifest:
    """The chief's progress port, from the operator's pods only: they read it. Both selectors in one
    peer: pods with these labels in that namespace, not any pod there (a tenant may run pods in the
    operator's namespace, or be let in through another of its workloads)."""
    operator: Manifest = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}}}
    if operator_pod_labels:
        operator["podSelector"] = {"matchLabels": dict(operator_pod_labels)}
    ingress = [{"from": [operator], "ports": _tcp(progress_port)}]
    chief = selector_labels(job_name, Role.CHIEF)
    return _policy(job_name, namespace, _progress_name(job_name), chief, ingress)

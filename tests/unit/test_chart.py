"""The Helm chart, linted and rendered with `helm template` (no cluster needed).

helm comes from PATH or from the e2e build cache (e2e/cluster/build.sh). Without it these tests
are skipped on a workstation and fail in CI (env CI set).
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.paths import CACHE
from psoperator.api import crd
from psoperator.api.labels import LABEL_JOB
from psoperator.contract import METRICS_PATH
from psoperator.render import render_children
from tests.unit.builders import job

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ps-training-operator"
KUBE_VERSION = "1.35.0"  # helm built from source assumes an old cluster unless told
RELEASE, NAMESPACE = "psop", "ops"


@pytest.fixture(scope="module")
def helm() -> str:
    cached = CACHE / "bin" / "helm"
    found = shutil.which("helm") or (str(cached) if cached.exists() else None)
    if found is None:
        reason = "helm not found on PATH or in the e2e cache: run e2e/cluster/cluster.sh build"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, check=False)


def documents(helm: str, *args: str) -> list[dict[str, Any]]:
    """The chart's objects, as `helm template` renders them."""
    result = run_helm(
        helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *args
    )
    assert result.returncode == 0, result.stderr
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [o for o in yaml.load_all(result.stdout, Loader=loader) if o]


def render(helm: str, *args: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The chart's objects by (kind, name)."""
    return {(o["kind"], o["metadata"]["name"]): o for o in documents(helm, *args)}


def chart_yaml() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return loaded


def one(objects: dict[tuple[str, str], dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [o for (k, _), o in objects.items() if k == kind]
    return found


def test_lint_passes(helm: str) -> None:
    result = run_helm(helm, "lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


def test_chart_metadata() -> None:
    assert chart_yaml()["appVersion"] == metadata.version("psoperator"), "bump appVersion with the package"


def test_template_renders_without_a_kube_version(helm: str) -> None:
    """As GitOps tools and users render it. Helm's offline default version (v1.20.0 for a Helm built
    from source) is no cluster's: the chart's version guard checks only a cluster it talks to."""
    result = run_helm(helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE)
    assert result.returncode == 0, result.stderr
    assert "kind: Deployment" in result.stdout


def test_default_objects(helm: str) -> None:
    kinds = sorted(kind for kind, _ in render(helm))
    assert kinds == [
        "ClusterRole", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget", "Role", "RoleBinding",
        "Secret", "Service", "ServiceAccount",
    ]  # fmt: skip


def test_deployment(helm: str) -> None:
    objects = render(helm)
    deployment = one(objects, "Deployment")
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 2  # one leads, the other takes over
    assert "strategy" not in deployment["spec"]  # a rolling update: the Lease hands over
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(objects, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    [container] = pod["containers"]
    assert container["image"] == f"ps-training-operator:{chart_yaml()['appVersion']}"
    assert container["args"] == [
        "run", "--all-namespaces", "--standalone", f"--leader-election={RELEASE}-ps-training-operator",
        "--lease-seconds=8", "--liveness=http://0.0.0.0:8080/healthz",
    ]  # fmt: skip
    assert {"name": "PSOPERATOR_METRICS_PORT", "value": "9090"} in container["env"]
    namespace = {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    assert namespace in container["env"]  # --operator-namespace: who may read the chiefs' progress
    # --operator-pod-labels: of that namespace, the operator's replicas alone (its selector's labels).
    told = {e["name"]: e.get("value") for e in container["env"]}["PSOPERATOR_POD_LABELS"]
    assert dict(pair.split("=") for pair in told.split(",")) == deployment["spec"]["selector"]["matchLabels"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] and container["resources"]["limits"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def _mounted_key(objects: dict[tuple[str, str], dict[str, Any]]) -> tuple[str, str]:
    """The Secret the operator's key comes from, and the file the operator is told to read it from."""
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "chief-key"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "chief-key"]
    assert mount["readOnly"] and volume["secret"]["items"] == [{"key": "key", "path": "key"}]
    told = {e["name"]: e.get("value") for e in container["env"]}["PSOPERATOR_CHIEF_KEY_FILE"]
    assert told == f"{mount['mountPath']}/key"
    return volume["secret"]["secretName"], told


def test_the_chart_makes_the_chief_key_once_and_mounts_it_in_every_replica(helm: str) -> None:
    objects = render(helm)
    name, _ = _mounted_key(objects)
    secret = objects[("Secret", name)]
    assert secret["metadata"]["namespace"] == NAMESPACE
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(secret["data"]["key"])) >= 32
    # Without a cluster, lookup finds nothing: each render makes a key (hence existingSecret).
    assert one(render(helm), "Secret")["data"]["key"] != secret["data"]["key"]


def test_an_existing_chief_key_secret_is_mounted_and_none_is_made(helm: str) -> None:
    objects = render(helm, "--set", "chiefKey.existingSecret=my-key")
    assert _mounted_key(objects)[0] == "my-key"
    assert [kind for kind, _ in objects if kind == "Secret"] == []


def test_values_drive_image_and_extra_args(helm: str) -> None:
    objects = render(
        helm,
        "--set",
        "image.repository=registry.example.com/psop",
        "--set",
        "image.tag=dev",
        "--set",
        "extraArgs={--verbose,--log-format=json}",
        "--set",
        "metrics.port=9191",
    )
    [container] = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/psop:dev"
    assert container["args"][6:] == ["--verbose", "--log-format=json"]
    assert {"name": "PSOPERATOR_METRICS_PORT", "value": "9191"} in container["env"]
    assert one(objects, "Service")["spec"]["ports"][0]["port"] == 9191


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _expect(groups: list[str], resources: list[str], verbs: str) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g in groups for r in resources for v in verbs.split()}


OWNED = "list watch create patch delete"
# What the operator does in the namespaces of its jobs.
NAMESPACED = (
    _expect(["psoperator.io"], ["pstrainingjobs"], "get list watch patch delete")
    | _expect(["psoperator.io"], ["pstrainingjobs/status"], "patch")
    | _expect(["psoperator.io"], ["pstrainingjobs/finalizers"], "update")
    | _expect([""], ["services", "configmaps"], OWNED)
    | _expect(["apps"], ["statefulsets"], OWNED)
    | _expect(["batch"], ["jobs"], OWNED)
    | _expect(["networking.k8s.io"], ["networkpolicies"], OWNED)
    | _expect([""], ["pods"], "list watch delete")
    | _expect(["", "events.k8s.io"], ["events"], "create patch")
    | _expect([""], ["secrets"], "create")  # the chiefs' tokens: never read
    | _expect(["kueue.x-k8s.io"], ["workloads"], OWNED)
    | _expect(["kueue.x-k8s.io"], ["workloads/status"], "patch")
)
CLUSTER_SCOPED = (
    _expect([""], ["nodes"], "list watch")
    | _expect(["apiextensions.k8s.io"], ["customresourcedefinitions"], "list watch")
    | _expect(["kueue.x-k8s.io"], ["resourceflavors", "workloadpriorityclasses"], "get")
)
KUEUE = (
    _expect(["kueue.x-k8s.io"], ["workloads"], OWNED)
    | _expect(["kueue.x-k8s.io"], ["workloads/status"], "patch")
    | _expect(["kueue.x-k8s.io"], ["resourceflavors", "workloadpriorityclasses"], "get")
)


def test_cluster_role_grants_exactly_what_the_operator_needs(helm: str) -> None:
    expected = NAMESPACED | CLUSTER_SCOPED | _expect([""], ["namespaces"], "list watch")
    objects = render(helm)
    assert _grants(one(objects, "ClusterRole")["rules"]) == expected


def test_kueue_switched_off_grants_nothing_of_kueue_and_the_operator_never_queues(helm: str) -> None:
    objects = render(helm, "--set", "kueue.enabled=false")
    expected = (NAMESPACED | CLUSTER_SCOPED | _expect([""], ["namespaces"], "list watch")) - KUEUE
    assert _grants(one(objects, "ClusterRole")["rules"]) == expected
    [container] = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "--no-kueue" in container["args"]


def test_namespace_scoped_mode_grants_roles_in_the_listed_namespaces_only(helm: str) -> None:
    listed = documents(helm, "--set", "watchNamespaces={team-a,team-b}")
    objects = {(o["kind"], o["metadata"]["name"]): o for o in listed}
    assert _grants(one(objects, "ClusterRole")["rules"]) == CLUSTER_SCOPED
    jobs_rbac = [o for o in listed if not o["metadata"]["name"].endswith("-leader-election")]
    roles = [o for o in jobs_rbac if o["kind"] == "Role"]
    bindings = [o for o in jobs_rbac if o["kind"] == "RoleBinding"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert all(_grants(r["rules"]) == NAMESPACED for r in roles)
    account = one(objects, "ServiceAccount")["metadata"]["name"]
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[0]["metadata"]["name"],
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    [container] = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["args"][:4] == ["run", "--namespace=team-a", "--namespace=team-b", "--standalone"]
    assert "--all-namespaces" not in container["args"]


def test_binding_ties_the_role_to_the_service_account(helm: str) -> None:
    objects = render(helm)
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == one(objects, "ClusterRole")["metadata"]["name"]
    account = one(objects, "ServiceAccount")["metadata"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
    ]


def test_metrics_service_selects_the_operator_pod(helm: str) -> None:
    objects = render(helm)
    service = one(objects, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
    ]
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def test_service_monitor_is_optional(helm: str) -> None:
    objects = render(helm, "--set", "metrics.serviceMonitor.enabled=true")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    service_labels = one(objects, "Service")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    result = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.service.enabled=false",
    )
    assert result.returncode != 0 and "metrics.service.enabled" in result.stderr


def test_trainer_pod_monitor_selects_the_chief_pods_progress_port(helm: str) -> None:
    assert not [k for k, _ in render(helm) if k == "PodMonitor"]  # off by default
    monitor = one(render(helm, "--set", "metrics.trainerPodMonitor.enabled=true"), "PodMonitor")
    chief = next(c for c in render_children(job()) if c["kind"] == "Job")
    template = chief["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = [p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])]
    assert endpoint["port"] in ports and endpoint["path"] == METRICS_PATH
    (relabel,) = endpoint["relabelings"]
    assert relabel["sourceLabels"] == [f"__meta_kubernetes_pod_label_{_prometheus_name(LABEL_JOB)}"]


def _prometheus_name(label: str) -> str:
    """A pod label as Prometheus's Kubernetes discovery names it: every other character becomes _."""
    return "".join(c if c.isalnum() else "_" for c in label)


def test_rbac_and_service_account_can_be_brought_by_the_user(helm: str) -> None:
    objects = render(
        helm,
        "--set",
        "rbac.create=false",
        "--set",
        "serviceAccount.create=false",
        "--set",
        "serviceAccount.name=ops-sa",
    )
    assert sorted(kind for kind, _ in objects) == ["Deployment", "PodDisruptionBudget", "Secret", "Service"]
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops-sa"


def test_the_chart_installs_the_generated_crd(helm: str) -> None:
    objects = render(helm, "--include-crds")
    assert objects[("CustomResourceDefinition", crd.CRD_NAME)] == crd.render_crd()


def test_two_replicas_on_different_nodes_one_kept_through_drains(helm: str) -> None:
    objects = render(helm)
    pod = one(objects, "Deployment")["spec"]["template"]
    [term] = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    )
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    single = render(helm, "--set", "replicaCount=1")
    assert one(single, "Deployment")["spec"]["replicas"] == 1
    assert not [kind for kind, _ in single if kind == "PodDisruptionBudget"]  # it would block every drain


def test_the_leader_lease_is_granted_in_the_operators_namespace_only(helm: str) -> None:
    objects = render(helm)
    role = objects[("Role", f"{RELEASE}-ps-training-operator-leader-election")]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _grants(role["rules"]) == _expect(["coordination.k8s.io"], ["leases"], "get create update")
    binding = objects[("RoleBinding", f"{RELEASE}-ps-training-operator-leader-election")]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == one(objects, "ServiceAccount")["metadata"]["name"]

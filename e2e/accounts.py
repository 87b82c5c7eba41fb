"""Kubeconfigs of ServiceAccounts, so that an operator under test runs with an account's RBAC, not
the admin's: the chart's own account and RBAC (rendered by `helm template`), or any account's token."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from kubernetes import client

from e2e.kubectl import kubectl
from e2e.paths import CACHE, REPO

CHART = REPO / "charts" / "ps-training-operator"
CHART_NAMESPACE = "psoperator-system"


def chart_account_kubeconfig(
    kubeconfig: Path, k8s: client.ApiClient, release: str, path: Path, *values: str
) -> Path:
    """Applies the chart's ServiceAccount and RBAC (of `release`, with helm `--set` values) and
    writes a kubeconfig with that account's token to `path`."""
    sets = [arg for value in values for arg in ("--set", value)]
    rendered = subprocess.run(
        [str(CACHE / "bin" / "helm"), "template", release, str(CHART), "--namespace", CHART_NAMESPACE,
         "--kube-version", client.VersionApi(k8s).get_code().git_version, *sets,
         "--show-only", "templates/serviceaccount.yaml", "--show-only", "templates/rbac.yaml"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    account = next(d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "ServiceAccount")
    namespace = kubectl(kubeconfig, "create", "namespace", CHART_NAMESPACE, "--dry-run=client", "-o", "yaml")
    kubectl(kubeconfig, "apply", "-f", "-", stdin=namespace + "---\n" + rendered)
    return token_kubeconfig(kubeconfig, CHART_NAMESPACE, account["metadata"]["name"], path)


def token_kubeconfig(kubeconfig: Path, namespace: str, account: str, path: Path) -> Path:
    """Writes to `path` a kubeconfig of the admin's cluster with a token of that ServiceAccount."""
    token = kubectl(kubeconfig, "create", "token", account, "-n", namespace, "--duration", "6h").strip()
    admin = yaml.safe_load(kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": cluster}],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [{"name": "operator", "context": {"cluster": "local", "user": "operator"}}],
                "current-context": "operator",
            }
        )
    )
    return path

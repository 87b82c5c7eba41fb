"""The chart's alerts and Grafana dashboard as the tests use them: rendered by helm, queried by promtool
and Prometheus (built by e2e/cluster/build.sh into the cache)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "ps-training-operator"
DASHBOARD = CHART / "files" / "dashboard.json"
CACHE = Path(os.environ.get("PSOPERATOR_CACHE", Path.home() / ".cache" / "psoperator"))
RELEASE = "psop"  # the promtool tests name the operator's scrape job after it
KUBE_VERSION = "1.35.0"
# Grafana's variables as a test fills them: every namespace and job, and a short rate window.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*", "$psjob": ".*"}


def tool(name: str) -> str:
    """A binary from PATH or the build cache; without it: skipped on a workstation, failed in CI."""
    cached = CACHE / "bin" / name
    found = str(cached) if cached.exists() else shutil.which(name)
    if found is None:
        reason = f"{name} not found in {cached.parent} or on PATH: run e2e/cluster/cluster.sh build"
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return found


def helm_template(helm: str, *args: str) -> str:
    """`helm template` of the chart as release RELEASE; fails the test on an error."""
    command = [helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout


def rendered_rules(helm: str, *values: str) -> dict[str, Any]:
    """The PrometheusRule's spec (its rule groups) as `helm template` renders it."""
    enabled = ("--set", "metrics.prometheusRule.enabled=true", "--show-only", "templates/prometheusrule.yaml")
    spec: dict[str, Any] = yaml.safe_load(helm_template(helm, *enabled, *values))["spec"]
    return spec


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


@dataclass(frozen=True)
class Query:
    panel: str
    ref: str
    expr: str  # with Grafana's variables filled in: plain PromQL


def dashboard_queries(board: dict[str, Any]) -> list[Query]:
    """Every panel query, and the selector inside every label_values() of the variables."""
    queries = [
        Query(panel["title"], target["refId"], fill_variables(target["expr"]))
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.*), *\w+\)", variable["query"]["query"])
            assert inner is not None, variable
            queries.append(Query(f"variable {variable['name']}", "label_values", fill_variables(inner[1])))
    return queries


def fill_variables(expr: str) -> str:
    for name, value in sorted(GRAFANA_VARIABLES.items(), key=lambda item: -len(item[0])):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable the tests do not fill: {expr}"
    return expr

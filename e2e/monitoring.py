"""The chart's alerts and Grafana dashboard as the tests use them: rendered by helm, queried by promtool
and Prometheus (built by e2e/cluster/build.sh into the cache)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e.paths import CACHE
from e2e.util import free_port, unavailable, wait_for

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "charts" / "ps-training-operator"
DASHBOARD = CHART / "files" / "dashboard.json"
RELEASE = "psop"  # the promtool tests name the operator's scrape job after it
KUBE_VERSION = "1.35.0"
SCRAPE_JOB = "psoperator"  # the job name of the e2e Prometheus's scrape of the operator
# Grafana's variables as a test fills them: every namespace and job, and a short rate window.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*", "$psjob": ".*"}


def tool(name: str) -> str:
    """A binary from PATH or the build cache; without it: skipped on a workstation, failed in CI."""
    cached = CACHE / "bin" / name
    found = str(cached) if cached.exists() else shutil.which(name)
    if found is None:
        reason = f"{name} not found in {cached.parent} or on PATH: run e2e/cluster/cluster.sh build"
        unavailable(reason)
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


class PrometheusProcess:
    """A real Prometheus scraping the operator's metrics endpoint every second (series labels as
    exported: honor_labels, as the chart's ServiceMonitor does), with the chart's alert rules."""

    def __init__(self, workdir: Path, target: str, rules: dict[str, Any]) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "rules.yaml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [
                {"job_name": SCRAPE_JOB, "honor_labels": True, "static_configs": [{"targets": [target]}]}
            ],
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            tool("prometheus"),
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        with (self.workdir / "prometheus.log").open("ab") as log:
            self._proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        wait_for(lambda: self._get("/-/ready") is not None, timeout=60, message="Prometheus ready")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=30)

    def _get(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as response:
                body: bytes = response.read()
                return body
        except OSError:
            return None

    def query(self, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query's result: each series' labels (sorted, without __name__) to its value."""
        body = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        assert body is not None, f"Prometheus did not answer {expr}"
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        return {
            tuple(sorted((k, v) for k, v in r["metric"].items() if k != "__name__")): float(r["value"][1])
            for r in answer["data"]["result"]
        }

    def value(self, expr: str) -> float | None:
        """The value of a query that selects at most one series (None: none)."""
        result = self.query(expr)
        assert len(result) <= 1, f"{expr}: {result}"
        return next(iter(result.values()), None)

    def wait_value(self, expr: str, check: Callable[[float], bool], timeout: float = 30) -> float:
        """Polls until the single series of `expr` has a value that passes `check`; returns it."""

        def passes() -> tuple[float] | None:  # a tuple: a value of 0 passes too
            found = self.value(expr)
            return (found,) if found is not None and check(found) else None

        (result,) = wait_for(passes, timeout=timeout, message=lambda: f"{expr} (now {self.query(expr)})")
        return result

    def log_text(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")

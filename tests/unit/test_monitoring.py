"""The chart's alerts and dashboard, checked by promtool (built from the Prometheus Go module by
e2e/cluster/build.sh): the rules are valid and each alert's unit tests (tests/unit/alerts/tests.yaml)
pass, firing and not firing; every dashboard query parses and uses only the operator's metrics."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import monitoring
from psoperator.metrics.registry import Metrics

ALERT_TESTS = Path(__file__).resolve().parent / "alerts" / "tests.yaml"


@pytest.fixture(scope="module")
def promtool() -> str:
    return monitoring.tool("promtool")


@pytest.fixture(scope="module")
def helm() -> str:
    return monitoring.tool("helm")


def promtool_run(promtool: str, *args: str) -> None:
    result = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_pass_promtool_check_and_their_unit_tests(helm: str, promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(monitoring.rendered_rules(helm)))
    shutil.copy(ALERT_TESTS, tmp_path / "tests.yaml")
    promtool_run(promtool, "check", "rules", str(tmp_path / "rules.yaml"))
    promtool_run(promtool, "test", "rules", str(tmp_path / "tests.yaml"))


def test_every_alert_is_tested_firing_and_not_firing(helm: str) -> None:
    alerts = {r["alert"] for g in monitoring.rendered_rules(helm)["groups"] for r in g["rules"]}
    evals = [e for t in yaml.safe_load(ALERT_TESTS.read_text())["tests"] for e in t["alert_rule_test"]]
    firing = {e["alertname"] for e in evals if e["exp_alerts"]}
    silent = {e["alertname"] for e in evals if not e["exp_alerts"]}
    assert alerts == firing == silent


def test_the_operator_job_and_thresholds_come_from_the_values(helm: str) -> None:
    rules = monitoring.rendered_rules(
        helm,
        "--set",
        "metrics.prometheusRule.operatorJob=ops",
        "--set",
        "metrics.prometheusRule.stalledFor=1h",
    )
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    assert 'up{job="ops"}' in exprs["PSOperatorDown"]
    assert "psoperator_job_step[1h]" in exprs["PSJobTrainingStalled"]


def test_every_dashboard_query_parses(promtool: str, tmp_path: Path) -> None:
    queries = monitoring.dashboard_queries(monitoring.dashboard())
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:query_{i}", "expr": q.expr} for i, q in enumerate(queries)],
            }
        ]
    }
    (tmp_path / "dashboard-queries.yaml").write_text(yaml.safe_dump(rules))
    promtool_run(promtool, "check", "rules", str(tmp_path / "dashboard-queries.yaml"))


def test_the_dashboard_uses_only_metrics_the_operator_exports() -> None:
    exported = {d.name for d in Metrics().reference}
    exported |= {f"{d.name}_{suffix}" for d in Metrics().reference for suffix in ("bucket", "sum", "count")}
    used = {
        m
        for q in monitoring.dashboard_queries(monitoring.dashboard())
        for m in re.findall(r"psoperator_\w+", q.expr)
    }
    assert used and used <= exported, used - exported


def test_the_dashboard_is_well_formed() -> None:
    """What Grafana needs to place and run every panel (no schema package is available offline)."""
    board: dict[str, Any] = monitoring.dashboard()
    assert board["uid"] and board["title"] and isinstance(board["schemaVersion"], int)
    panels = board["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        pos = panel["gridPos"]
        assert set(pos) == {"x", "y", "w", "h"} and pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            refs = [t["refId"] for t in panel["targets"]]
            assert refs and len(set(refs)) == len(refs), panel["title"]
    names = [v["name"] for v in board["templating"]["list"]]
    assert names == ["datasource", "namespace", "psjob"]


def test_the_chart_ships_the_rules_and_the_dashboard_only_when_asked(helm: str) -> None:
    def kinds(*values: str) -> set[str]:
        objects = yaml.safe_load_all(monitoring.helm_template(helm, *values))
        return {f"{o['kind']}/{o['metadata']['name']}" for o in objects if o}

    off = kinds()
    on = kinds(
        "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.grafanaDashboard.enabled=true"
    )
    assert on - off == {
        "PrometheusRule/psop-ps-training-operator",
        "ConfigMap/psop-ps-training-operator-dashboard",
    }


def test_the_dashboard_configmap_carries_the_sidecar_label_and_the_json(helm: str) -> None:
    rendered = monitoring.helm_template(
        helm,
        "--set",
        "metrics.grafanaDashboard.enabled=true",
        "--show-only",
        "templates/grafana-dashboard.yaml",
    )
    configmap = yaml.safe_load(rendered)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert yaml.safe_load(configmap["data"]["ps-training-operator.json"]) == monitoring.dashboard()

"""The operator's metrics as a real Prometheus scrapes them, through a job's whole life.

The operator runs with --metrics-port (and --log-format=json); a Prometheus built from its Go module
(e2e/cluster/build.sh) scrapes it every second with the chart's alert rules loaded. A job goes
create -> Running -> a PS OOMKilled -> recovery -> Succeeded -> deleted; each stage is asserted
through Prometheus's query API, and so are the Grafana dashboard's queries.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from e2e import chaos, monitoring, psjobs
from e2e.kubectl import kubectl
from e2e.operator_process import OperatorProcess
from e2e.test_progress import serve_progress
from e2e.util import free_port, wait_for
from psoperator.contract import ProgressReport

# Failure injection and loopback pod IPs need KWOK's simulated nodes.
pytestmark = pytest.mark.usefixtures("kwok_only")
# Series of a dashboard panel that this run gives no reason to exist: no job fails.
NO_DATA_IN_THIS_RUN = {("Jobs succeeded and failed (since the operator started)", "B")}


@pytest.fixture
def scraped(
    operator: OperatorProcess, tmp_path: Path
) -> Iterator[tuple[OperatorProcess, monitoring.PrometheusProcess, int]]:
    """The operator restarted with metrics, JSON logs and its own progress port (pod IPs are shared
    by every local cluster on this machine), and a Prometheus scraping it."""
    metrics_port, progress_port = free_port(), free_port()
    operator.stop()
    operator.extra_args += [
        "--metrics-port", str(metrics_port), "--progress-port", str(progress_port), "--log-format=json"
    ]  # fmt: skip
    operator.start()
    helm = monitoring.tool("helm")
    rules = monitoring.rendered_rules(
        helm, "--set", f"metrics.prometheusRule.operatorJob={monitoring.SCRAPE_JOB}"
    )
    prometheus = monitoring.PrometheusProcess(tmp_path / "prometheus", f"127.0.0.1:{metrics_port}", rules)
    prometheus.start()
    try:
        yield operator, prometheus, progress_port
    finally:
        prometheus.stop()


def _report(step: int, checkpoint: int) -> dict[str, object]:
    report = ProgressReport(
        state="running", step=step, checkpoint_step=checkpoint, checkpoint_time=time.time() - 5
    )
    loaded: dict[str, object] = json.loads(report.to_json())
    return loaded


def test_prometheus_sees_a_job_through_failure_recovery_success_and_deletion(
    k8s: client.ApiClient,
    namespace: str,
    kubeconfig: Path,
    scraped: tuple[OperatorProcess, monitoring.PrometheusProcess, int],
) -> None:
    operator, prom, progress_port = scraped
    ns = f'namespace="{namespace}"'
    job = f'{ns}, psjob="ctr"'

    psjobs.create(k8s, namespace, psjobs.manifest("ctr", checkpoint={"dir": "/ckpt", "intervalSteps": 100}))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    prom.wait_value(f'psoperator_job_phase{{{job}, phase="Running"}}', lambda v: v == 1)
    prom.wait_value(f'psoperator_job_replicas_ready{{{job}, role="ps"}}', lambda v: v == 2)
    prom.wait_value(f'psoperator_job_replicas_running{{{job}, role="worker"}}', lambda v: v == 2)
    assert prom.value(f"psoperator_jobs_created_total{{{ns}}}") == 1
    assert prom.value(f'psoperator_jobs{{{ns}, phase="Running"}}') == 1
    startup = prom.wait_value(f"psoperator_job_startup_seconds_sum{{{ns}}}", lambda v: v >= 0)
    print(f"\ncreate -> every pod running: {startup:.0f} s (whole seconds of the API's timestamps)")

    chief = psjobs.running_pod(k8s, namespace, "ctr", "chief")
    hits: list[str] = []
    with serve_progress(chief["status"]["podIP"], _report(300, 200), hits, progress_port) as report:
        prom.wait_value(f"psoperator_job_step{{{job}}}", lambda v: v == 300)
        assert prom.value(f"psoperator_job_checkpoint_step{{{job}}}") == 200
        assert prom.value(f"psoperator_job_checkpoint_interval_steps{{{job}}}") == 100
        prom.wait_value(f"psoperator_job_checkpoint_age_seconds{{{job}}}", lambda v: v >= 5)
        # One step in a resync or more: a rate of at most 0.1 step/s, at which the checkpoint of step
        # 200 (interval 100) is not too old for hours. At 100 steps a poll (10 steps/s), it would be
        # after 30 s, and the new chief serves no progress: PSJobCheckpointTooOld would be pending
        # by the end on a slow machine (it was, once, in a cold run), rightly.
        report["step"] = 301
        rate = prom.wait_value(f"psoperator_job_step_rate{{{job}}}", lambda v: v > 0)
        print(f"step rate after one step: {rate:.2f} steps/s")

        wait_for(lambda: psjobs.status(k8s, namespace, "ctr")["tracking"]["psEstablished"], timeout=30)
        ps = psjobs.running_pod(k8s, namespace, "ctr", "ps", 1)
        chaos.oom_kill(k8s, namespace, ps["metadata"]["name"])
        restarted = f'psoperator_jobs_restarted_total{{{ns}, reason="ParameterServerLost"}}'
        prom.wait_value(restarted, lambda v: v == 1)
    assert prom.value(f'psoperator_job_pod_restarts_total{{{job}, role="ps", reason="OOMKilled"}}') == 1

    recovery = prom.wait_value(f"psoperator_job_recovery_seconds_sum{{{job}}}", lambda v: v >= 0, timeout=60)
    assert prom.value(f"psoperator_job_recovery_seconds_count{{{job}}}") == 1
    assert recovery < 30
    print(f"PS OOMKilled -> chief and every PS running again: {recovery:.2f} s (from its whole second)")
    prom.wait_value(f'psoperator_job_phase{{{job}, phase="Running"}}', lambda v: v == 1)
    prom.wait_value(f'psoperator_job_replicas_ready{{{job}, role="ps"}}', lambda v: v == 2)
    # The status, in the message, says which failures were counted.
    status = psjobs.status(k8s, namespace, "ctr")
    assert prom.value(f'psoperator_job_replicas_restarts{{{job}, role="ps"}}') == 1, status
    assert prom.value(f"psoperator_job_counted_restarts{{{job}}}") == 0  # the checkpoint moved: not counted

    new_chief = psjobs.running_pod(k8s, namespace, "ctr", "chief")
    assert new_chief["metadata"]["uid"] != chief["metadata"]["uid"]
    done = ProgressReport(
        state="succeeded", step=1000, checkpoint_step=1000, checkpoint_time=time.time()
    ).to_json()
    chaos.fail_container(k8s, namespace, new_chief["metadata"]["name"], exit_code=0, message=done)
    psjobs.wait_phase(k8s, namespace, "ctr", "Succeeded", timeout=60)
    prom.wait_value(f"psoperator_jobs_succeeded_total{{{ns}}}", lambda v: v == 1)
    prom.wait_value(f'psoperator_job_phase{{{job}, phase="Succeeded"}}', lambda v: v == 1)
    assert prom.value(f'psoperator_jobs{{{ns}, phase="Succeeded"}}') == 1
    assert prom.value(f"psoperator_job_step{{{job}}}") == 1000
    _dashboard_queries_return_data(prom)
    _no_alert_but(prom, set())
    _the_story_is_told(k8s, namespace, kubeconfig)

    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(
        psjobs.GROUP, psjobs.VERSION, namespace, psjobs.PLURAL, "ctr"
    )
    wait_for(
        lambda: not prom.query(f"{{{job}}}"),
        timeout=30,
        message=lambda: f"no series of ctr: {prom.query(f'{{{job}}}')}",
    )
    assert prom.value("psoperator_jobs_managed") == 0
    assert prom.value(f"psoperator_jobs_created_total{{{ns}}}") == 1  # the namespace's counters stay
    _every_log_line_is_json_and_names_its_job(operator.log_text(), namespace)


def _dashboard_queries_return_data(prom: monitoring.PrometheusProcess) -> None:
    queries = monitoring.dashboard_queries(monitoring.dashboard())
    empty = {(q.panel, q.ref) for q in queries if not prom.query(q.expr)}
    assert empty == NO_DATA_IN_THIS_RUN


def _the_story_is_told(k8s: client.ApiClient, namespace: str, kubeconfig: Path) -> None:
    """`kubectl describe` reads like a story, `kubectl get -o wide` shows the checkpoint and the failure."""
    listed = client.CoreV1Api(k8s).list_namespaced_event(namespace, field_selector="involvedObject.name=ctr")
    events = [(str(e.reason), str(e.message), str(e.metadata.creation_timestamp)) for e in listed.items]
    story = [
        "Created",
        "Running",
        "AllRunning",
        "ParameterServerLost",
        "RecyclingParameterServers",
        "Recovered",
        "Succeeded",
    ]
    assert sorted(reason for reason, _, _ in events) == sorted(story)
    # In this order (events carry whole seconds: those of one reconcile tie).
    when = {reason: at for reason, _, at in events}
    assert [when[r] for r in story] == sorted(when[r] for r in story)
    told = {reason: message for reason, message, _ in events}
    assert "ps 1 (ctr-ps-1): OOMKilled (exit code 137)" in told["ParameterServerLost"]
    assert "from the latest checkpoint, step 200" in told["ParameterServerLost"]
    assert told["Recovered"].endswith("s after the failure")  # no progress served by the new chief
    header, row = kubectl(kubeconfig, "get", "psjob", "ctr", "-n", namespace, "-o", "wide").splitlines()
    assert header.split()[-6:] == ["CHECKPOINT", "CHECKPOINT", "AGE", "LAST", "FAILURE", "QUEUE"]
    # A job not queued has no Queue: kubectl prints nothing in that column.
    assert row.split()[-4] == "1000" and row.split()[-2:] == ["ps-1", "OOMKilled"]


def _no_alert_but(prom: monitoring.PrometheusProcess, expected: set[str]) -> None:
    """The chart's alerts, evaluated by this Prometheus: only `expected` are pending or firing."""
    alerts = {dict(labels)["alertname"] for labels in prom.query("ALERTS")}
    assert alerts == expected


def _every_log_line_is_json_and_names_its_job(log: str, namespace: str) -> None:
    """kopf's JSON format: a line about a job or one of its children names it (its `object`); lines
    without one are the operator's own (start-up, probes) and mention no job."""
    since_json = log.rsplit("=== start", 1)[1].splitlines()[1:]  # the last start: with --log-format=json
    records = [json.loads(line) for line in since_json if line]
    named = [r["object"] for r in records if "object" in r]
    assert named and all(o["namespace"] == namespace and o["name"].startswith("ctr") for o in named)
    assert {"PSTrainingJob", "Pod", "Job", "StatefulSet"} <= {o["kind"] for o in named}
    assert not [r for r in records if "object" not in r and "ctr" in r["message"]]

"""Progress without API credentials: the operator polls the chief's /progress endpoint.

The local cluster gives pods loopback addresses (127.42.n.m), so the test plays the chief's
runtime by serving a progress report on the chief pod's IP, as the trainer image does in a real pod.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e import chaos, psjobs
from e2e.kubectl import _kubectl
from e2e.operator_process import OperatorProcess, chief_key
from e2e.util import condition, holds_for, wait_for
from psoperator.contract import CHECKPOINT_PATH, DEFAULT_PROGRESS_PORT, PROGRESS_PATH, ProgressReport

# Failure injection and loopback pod IPs need KWOK's simulated nodes.
pytestmark = pytest.mark.usefixtures("kwok_only")


@contextmanager
def serve_progress(
    address: str,
    report: dict[str, Any],
    hits: list[str],
    port: int = DEFAULT_PROGRESS_PORT,
    advance: bool = False,
    checkpoint: dict[str, Any] | None = None,
    token: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Serves `report` (mutable: change it to move training along) at the chief's progress URL;
    with `advance`, its step moves on by one at every request; with `checkpoint`, answers
    POST /checkpoint with it; with `token`, answers 401 to a request without it, as the trainer does.

    Every request's path is appended to `hits` (a POST's as "POST <path>", a refused one's as
    "401 <path>").
    """

    class Handler(http.server.BaseHTTPRequestHandler):
        def parse_request(self) -> bool:
            if not super().parse_request():
                return False
            if token is None or self.headers.get("Authorization") == f"Bearer {token}":
                return True
            hits.append(f"401 {self.path}")
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return False

        def do_POST(self) -> None:
            hits.append(f"POST {self.path}")
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            answer = checkpoint if self.path == CHECKPOINT_PATH else None
            self.send_response(200 if answer is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(json.dumps(answer).encode() if answer is not None else b"")

        def do_GET(self) -> None:
            hits.append(self.path)
            if advance:
                report["step"] += 1
            body = json.dumps(report).encode() if self.path == PROGRESS_PATH else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield report
    finally:
        server.shutdown()
        server.server_close()


def test_step_and_checkpoint_come_from_the_chief(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess, kubeconfig: Path
) -> None:
    import subprocess

    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    chief = psjobs.running_pod(k8s, namespace, "ctr", "chief")
    address = chief["status"]["podIP"]
    assert address.startswith("127."), f"pod IPs must be on loopback for this test, got {address}"

    report = ProgressReport(
        state="running",
        step=1400,
        checkpoint_step=1200,
        checkpoint_path="/ckpt/ckpt-12",
        checkpoint_time=1_790_000_000.0,
        examples_per_second=5120.0,
        loss=0.42,
    )
    hits: list[str] = []
    created = psjobs.get(k8s, namespace, "ctr")
    assert created is not None
    # The job's token, which the operator sends: the step below is read with it. (Other requests
    # may be refused: every local cluster on this host gives its pods addresses of the same range,
    # so another cluster's operator may poll this address for a chief of its own.)
    token = chief_key().token(created["metadata"]["uid"])
    with serve_progress(address, json.loads(report.to_json()), hits, token=token) as served:
        status = wait_for(
            lambda: (s := psjobs.status(k8s, namespace, "ctr")).get("step") == 1400 and s,
            timeout=30,
            message="the step from the chief",
        )
        assert status["checkpoint"] == {"step": 1200, "path": "/ckpt/ckpt-12", "time": "2026-09-21T14:13:20Z"}
        served["step"] = 1500
        wait_for(
            lambda: psjobs.status(k8s, namespace, "ctr").get("step") == 1500,
            timeout=30,
            message="the step advancing",
        )
        # A garbled report is ignored (the last good figures stay) and does not hurt the operator.
        served.clear()
        served["step"] = "not a number"
        polled = len(hits)
        wait_for(lambda: len(hits) >= polled + 2, timeout=30, message="two polls of the garbled report")
        assert operator.running

    out = subprocess.run(
        [_kubectl(), "--kubeconfig", str(kubeconfig), "get", "psjob", "ctr", "-n", namespace],
        capture_output=True, text=True, check=True, timeout=30,
    ).stdout  # fmt: skip
    header, row = out.splitlines()[:2]
    step_column = header.split().index("STEP")
    assert row.split()[step_column] == "1500"
    assert psjobs.status(k8s, namespace, "ctr")["step"] == 1500


def test_stalled_when_the_step_stops_advancing(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", failurePolicy={"stallTimeoutSeconds": 3}))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    address = psjobs.running_pod(k8s, namespace, "ctr", "chief")["status"]["podIP"]
    hits: list[str] = []
    with serve_progress(address, {"state": "running", "step": 7}, hits) as served:

        def stalled() -> bool:
            found = condition(psjobs.status(k8s, namespace, "ctr"), "Stalled")
            return found is not None and found["status"] == "True"

        wait_for(stalled, timeout=40, message="the Stalled condition")
        served["step"] = 8
        wait_for(lambda: not stalled(), timeout=30, message="Stalled cleared once the step moves")
    events = client.CoreV1Api(k8s).list_namespaced_event(namespace, field_selector="involvedObject.name=ctr")
    assert "Stalled" in {e.reason for e in events.items}


def test_a_training_job_is_polled_once_per_resync_and_not_woken_by_its_own_status_writes(
    k8s: client.ApiClient, namespace: str, crd: str, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    """Every poll moves the step, so every reconcile writes the status: the job must not wake on
    the echo of that write, or it polls and writes in a loop instead of once per resync."""
    resync = 1.0
    operator = OperatorProcess(
        operator_kubeconfig, namespace, tmp_path / "operator.log", ["--resync-seconds", str(resync)]
    )
    operator.start()
    try:
        psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
        psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
        address = psjobs.running_pod(k8s, namespace, "ctr", "chief")["status"]["podIP"]
        hits: list[str] = []
        with serve_progress(address, {"state": "running", "step": 0}, hits, advance=True):
            wait_for(lambda: psjobs.status(k8s, namespace, "ctr").get("step"), timeout=30, message="a step")
            polled, step = len(hits), psjobs.status(k8s, namespace, "ctr")["step"]
            window = 8.0
            holds_for(lambda: operator.running, duration=window)  # the window in which polls are counted
            polls = len(hits) - polled
            written = psjobs.status(k8s, namespace, "ctr")["step"] - step
        # One poll per resync (jittered by 10%), and a little slack for the window's edges.
        assert polls <= window / (resync * 0.9) + 2, f"{polls} polls in {window}s"
        assert written >= window / resync / 2, f"the step moved by {written} only"
    finally:
        operator.stop()


def test_an_evicted_ps_makes_the_operator_ask_the_chief_for_a_checkpoint_before_the_restart(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr"))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    wait_for(lambda: psjobs.status(k8s, namespace, "ctr")["tracking"]["psEstablished"], timeout=30)
    chief = psjobs.running_pod(k8s, namespace, "ctr", "chief")
    report = json.loads(ProgressReport(state="running", step=1400, checkpoint_step=1200).to_json())
    saved = {"checkpointStep": 1420, "checkpointPath": "/ckpt/ckpt-1420", "saved": True}
    hits: list[str] = []
    with serve_progress(chief["status"]["podIP"], report, hits, checkpoint=saved):
        wait_for(lambda: psjobs.status(k8s, namespace, "ctr").get("step") == 1400, timeout=30)
        chaos.evict_pod(k8s, namespace, "ctr-ps-1", drain_seconds=8)
        status = wait_for(
            lambda: (s := psjobs.status(k8s, namespace, "ctr")).get("restarts") == 1 and s,
            timeout=30,
            message="the restart after the evicted PS",
        )
    assert f"POST {CHECKPOINT_PATH}" in hits
    stop = status["lastPlannedStop"]
    assert (stop["cause"], stop["pods"], stop["checkpointStep"]) == ("Drain", ["ctr-ps-1"], 1420), status
    assert status["countedRestarts"] == 0 and status["lastFailure"]["reason"] == "Evicted", status
    events = client.CoreV1Api(k8s).list_namespaced_event(namespace, field_selector="involvedObject.name=ctr")
    told = [e.message or "" for e in events.items if e.reason == "CheckpointedBeforeStop"]
    assert len(told) == 1 and "step 1420" in told[0], told

"""The example job trains for real: TensorFlow in pods on real kubelets (kind: the PS and the chief on
one node, the GPU workers on another), the cluster formed over cluster DNS through its
NetworkPolicies, checkpoints on a shared PersistentVolume, the operator in-cluster under the chart's
RBAC. Then the same job broken on purpose, with real signals:

- a parameter server SIGKILLed mid-training: the kubelet restarts it in place, the operator replaces
  the chief, the new chief resumes from the latest checkpoint, the job succeeds;
- a worker SIGKILLed: the chief carries on, nothing restarts, the job succeeds;
- the chief pod deleted (SIGTERM, exit 143): a restart that does not count, the job succeeds.

Each prints its figures (see the table at the end of the run).
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from e2e import monitoring, psjobs
from e2e.kubectl import kubectl
from e2e.real import enforcers, example
from e2e.real.commands import get_from_node, in_node_network, on_node, port_forward
from e2e.real.conftest import Figures
from e2e.util import as_json, wait_for
from psoperator.api.models import ModelHints
from psoperator.api.names import CHIEF_TOKEN_VOLUME
from psoperator.contract import DEFAULT_PROGRESS_PORT, PROGRESS_PATH
from psoperator.sizing.planner import plan_ps

STEPS = int(os.environ.get("PSOPERATOR_REAL_STEPS", "1200"))
CHECKPOINT_STEPS = example.CHECKPOINT_STEPS
TRAIN_TIMEOUT = 600.0
# Long enough that the operator polls the chief while it trains: a running job is polled once per
# resync (10 s, jittered by 10%) and a step alone is written at most every 5 s; STEPS take about
# 8 s here, these about 20 s.
LONGER_STEPS = STEPS * 5 // 2
Obj = dict[str, Any]


def apply_example(
    kubeconfig: Path,
    namespace: str,
    ttl: int | None = None,
    checkpoint_steps: int = CHECKPOINT_STEPS,
    steps: int = STEPS,
) -> str:
    docs = example.manifests(namespace, steps, ttl, checkpoint_steps)
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    return str(next(d["metadata"]["name"] for d in docs if d["kind"] == "PSTrainingJob"))


def progress(api: client.ApiClient, pod: Obj) -> Obj:
    """The chief's own report, read from its pod IP (what the operator polls), from its node, with
    its job's token."""
    return dict(
        json.loads(get_from_node(pod["spec"]["nodeName"], progress_url(pod), token=chief_token(api, pod)))
    )


def progress_url(pod: Obj) -> str:
    return f"http://{pod['status']['podIP']}:{DEFAULT_PROGRESS_PORT}{PROGRESS_PATH}"


def chief_token(api: client.ApiClient, pod: Obj) -> str:
    """The token a chief pod's progress port wants: in the Secret the operator made for its job,
    which the pod mounts."""
    volumes = pod["spec"]["volumes"]
    name = next(v["secret"]["secretName"] for v in volumes if v["name"] == CHIEF_TOKEN_VOLUME)
    secret = as_json(api, client.CoreV1Api(api).read_namespaced_secret(name, pod["metadata"]["namespace"]))
    return base64.b64decode(secret["data"]["token"]).decode()


# Run in the chief's node's network namespace: prints each step the chief reports, every 50 ms,
# until stopped (a read that fails prints nothing). The job's token comes in $BEARER.
_POLL_STEPS = """
import json, os, sys, time, urllib.request
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + os.environ["BEARER"]})
while True:
    try:
        print(json.load(urllib.request.urlopen(request, timeout=1)).get("step", 0), flush=True)
    except Exception:
        pass
    time.sleep(0.05)
"""


class LastStep:
    """The highest step a chief pod reports, polled from its node every 50 ms until stopped: the step
    it reached, when it is stopped after the chief stopped answering."""

    def __init__(self, api: client.ApiClient, pod: Obj) -> None:
        self.step = 0
        self._poller = subprocess.Popen(
            [*in_node_network(pod["spec"]["nodeName"]), sys.executable, "-c", _POLL_STEPS, progress_url(pod)],
            stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
            env={**os.environ, "BEARER": chief_token(api, pod)},
        )  # fmt: skip
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._poller.stdout is not None
        for line in self._poller.stdout:
            self.step = max(self.step, int(line))

    def stop(self) -> int:
        self._poller.terminate()
        self._poller.wait(timeout=30)
        self._thread.join()
        return self.step


def chief_pods(api: client.ApiClient, namespace: str, name: str) -> list[Obj]:
    return sorted(
        psjobs.pods(api, namespace, name, "chief"), key=lambda p: p["metadata"]["creationTimestamp"]
    )


def running_chief(api: client.ApiClient, namespace: str, name: str, min_step: int) -> tuple[Obj, Obj]:
    """The chief pod once it reports at least `min_step`, with that report."""

    def ready() -> tuple[Obj, Obj] | None:
        for pod in psjobs.live_pods(api, namespace, name, "chief"):
            if pod["status"].get("podIP"):
                report = progress(api, pod)
                if report.get("step", 0) >= min_step:
                    return pod, report
        return None

    return wait_for(ready, timeout=TRAIN_TIMEOUT, interval=1, message=f"{name}'s chief at step {min_step}")


def trainer_container_id(pod: Obj) -> str:
    status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "trainer")
    return str(status["containerID"]).split("://", 1)[1]


def sigkill(pod: Obj) -> float:
    """SIGKILL to the trainer container's process, from its node, as an OOM kill or crash would."""
    on_node(
        pod["spec"]["nodeName"],
        "ctr", "--namespace", "k8s.io", "tasks", "kill", "--signal", "SIGKILL", trainer_container_id(pod),
    )  # fmt: skip
    return time.monotonic()


def restarted_in_place(api: client.ApiClient, namespace: str, pod: Obj) -> None:
    """The kubelet restarts the killed container in the same pod (restartPolicy Always)."""

    def restarted() -> bool:
        now = as_json(api, client.CoreV1Api(api).read_namespaced_pod(pod["metadata"]["name"], namespace))
        trainer = next(s for s in now["status"]["containerStatuses"] if s["name"] == "trainer")
        return bool(now["metadata"]["uid"] == pod["metadata"]["uid"] and trainer["restartCount"] >= 1)

    wait_for(restarted, timeout=60, message=f"{pod['metadata']['name']} restarted in place")


def wait_succeeded(api: client.ApiClient, namespace: str, name: str) -> Obj:
    def done() -> Obj | None:
        current = psjobs.status(api, namespace, name)
        if current.get("phase") == "Failed":
            raise AssertionError(f"{name} failed: {current}")
        return current if current.get("phase") == "Succeeded" else None

    result: Obj = wait_for(
        done, timeout=TRAIN_TIMEOUT, interval=1, message=lambda: str(psjobs.status(api, namespace, name))
    )
    return result


@pytest.fixture
def job_namespace(namespace: str, release: str) -> str:
    """A namespace of the test's own, with the operator of the chart running in-cluster."""
    return namespace


def test_the_example_trains_to_succeeded_with_its_policies_enforced_and_the_ttl_deletes_it(
    kubeconfig: Path, k8s: client.ApiClient, job_namespace: str, figures: Figures
) -> None:
    """Where kube-router runs (kind.sh's node image), the job's NetworkPolicies are on the nodes
    while it trains: its cluster forms over cluster DNS through them."""
    enforcer = enforcers.find(kubeconfig, k8s)
    started = time.monotonic()
    name = apply_example(kubeconfig, job_namespace, ttl=5, steps=LONGER_STEPS)
    psjobs.wait_phase(k8s, job_namespace, name, "Running", timeout=180)
    figures.record("apply → Running", time.monotonic() - started, "s")
    chief, _ = running_chief(k8s, job_namespace, name, min_step=1)
    figures.record("apply → first step", time.monotonic() - started, "s")
    if enforcer is not None:
        wait_for(
            lambda: enforcer.enforces(job_namespace, name), timeout=60, message="the policies on the nodes"
        )
    figures.record("the example trains with its NetworkPolicies", "enforced" if enforcer else "no enforcer")

    # STEP in `kubectl get psjob` shows a step of the training under way, then a later one.
    def step_column() -> int:
        row = kubectl(kubeconfig, "get", "psjob", name, "-n", job_namespace, "--no-headers").split()
        return int(row[5]) if len(row) > 6 and row[5].isdigit() else -1

    first = wait_for(lambda: 0 < (step := step_column()) < LONGER_STEPS and step, timeout=120,
                     message="STEP filled while training")  # fmt: skip
    wait_for(lambda: step_column() > first, timeout=120, message=f"STEP past {first}")

    final = wait_succeeded(k8s, job_namespace, name)
    figures.record(f"apply → Succeeded ({LONGER_STEPS} steps)", time.monotonic() - started, "s")
    assert final["step"] == LONGER_STEPS and final["restarts"] == 0, final
    assert final["checkpoint"]["step"] == LONGER_STEPS, final
    assert chief["metadata"]["uid"] == chief_pods(k8s, job_namespace, name)[-1]["metadata"]["uid"]

    # Success stops every other role, the evaluator included.
    wait_for(
        lambda: not any(psjobs.live_pods(k8s, job_namespace, name, r) for r in ("ps", "worker", "evaluator")),
        timeout=60,
        message="the parameter servers, workers and evaluator stopped",
    )
    # The TTL deletes the finished job: the chart's RBAC lets the operator delete it.
    wait_for(
        lambda: psjobs.get(k8s, job_namespace, name) is None, timeout=60, message=f"{name} deleted by its TTL"
    )


def test_a_killed_parameter_server_restarts_the_chief_from_the_latest_checkpoint(
    kubeconfig: Path, k8s: client.ApiClient, job_namespace: str, figures: Figures
) -> None:
    name = apply_example(kubeconfig, job_namespace)
    old_chief, report = running_chief(k8s, job_namespace, name, min_step=CHECKPOINT_STEPS + 20)
    assert report.get("checkpointStep", 0) >= CHECKPOINT_STEPS, report
    ps0 = next(p for p in psjobs.pods(k8s, job_namespace, name, "ps") if p["metadata"]["name"].endswith("-0"))
    last = LastStep(k8s, old_chief)
    wait_for(
        lambda: last.step >= report["step"], timeout=30, message="the chief's steps polled from its node"
    )
    killed = sigkill(ps0)

    def new_chief() -> Obj | None:
        pods = chief_pods(k8s, job_namespace, name)
        return next((p for p in pods if p["metadata"]["uid"] != old_chief["metadata"]["uid"]), None)

    wait_for(new_chief, timeout=120, interval=0.1, message="a new chief pod")
    figures.record("PS SIGKILL → new chief pod", time.monotonic() - killed, "s")
    # The chief cannot step past a dead PS: the last step it reported is the step it reached.
    step_at_kill = last.stop()
    restarted_in_place(k8s, job_namespace, ps0)

    final = wait_succeeded(k8s, job_namespace, name)
    figures.record("PS SIGKILL → Succeeded", time.monotonic() - killed, "s")
    resumed = final.get("resumedFromStep")
    assert resumed and resumed % CHECKPOINT_STEPS == 0 and 0 < resumed <= step_at_kill, final
    figures.record("PS SIGKILL: steps lost (step at kill minus resumed from)", str(step_at_kill - resumed))
    assert final["step"] == STEPS and final["restarts"] == 1, final
    assert final["lastFailure"]["role"] == "ps", final


def test_a_killed_worker_is_replaced_while_training_goes_on(
    kubeconfig: Path, k8s: client.ApiClient, job_namespace: str, figures: Figures
) -> None:
    name = apply_example(kubeconfig, job_namespace)
    chief, _ = running_chief(k8s, job_namespace, name, min_step=CHECKPOINT_STEPS)
    worker0 = next(
        p for p in psjobs.pods(k8s, job_namespace, name, "worker") if p["metadata"]["name"].endswith("-0")
    )
    killed = sigkill(worker0)
    restarted_in_place(k8s, job_namespace, worker0)
    final = wait_succeeded(k8s, job_namespace, name)
    figures.record("worker SIGKILL → Succeeded", time.monotonic() - killed, "s")
    assert final["restarts"] == 0 and final["step"] == STEPS, final
    assert final["lastFailure"]["role"] == "worker", final
    assert [p["metadata"]["uid"] for p in chief_pods(k8s, job_namespace, name)] == [chief["metadata"]["uid"]]


def test_a_deleted_chief_exits_143_and_its_restart_does_not_count(
    kubeconfig: Path, k8s: client.ApiClient, job_namespace: str, figures: Figures
) -> None:
    """Deleted before its first periodic checkpoint, so no progress excuses the restart: only the
    chief's own exit code 143 (SIGTERM, from the kubelet) keeps it out of the restart budget. On
    SIGTERM the chief saves first: the new chief resumes from the step it was stopped at."""
    name = apply_example(kubeconfig, job_namespace, checkpoint_steps=STEPS - 200)
    chief, report = running_chief(k8s, job_namespace, name, min_step=20)
    deleted = time.monotonic()
    kubectl(kubeconfig, "delete", "pod", chief["metadata"]["name"], "-n", job_namespace, "--wait=false")
    final = wait_succeeded(k8s, job_namespace, name)
    figures.record("chief deleted → Succeeded", time.monotonic() - deleted, "s")
    assert final["restarts"] == 1 and final.get("countedRestarts", 0) == 0, final
    assert final["lastFailure"]["role"] == "chief" and final["lastFailure"].get("exitCode") == 143, final
    resumed = final.get("resumedFromStep") or 0
    assert final["step"] == STEPS and report["step"] <= resumed < STEPS - 200, final
    figures.record(
        "chief deleted: resumed from (saved on SIGTERM), step before it", f"{resumed}, {report['step']}"
    )


# A model whose copy stands out from the TensorFlow runtime: 4,000,000 x 16 fp32 and Adagrad's
# accumulator, 256 MiB of state on each of 2 PS.
BIG_VOCAB, BIG_DIM = 4_000_000, 16
BIG_MODEL = [f"--vocab-size={BIG_VOCAB}", f"--embedding-dim={BIG_DIM}"]
# The same model as the sizing planner sees it (the runtime's default 64 MiB shards).
BIG_MODEL_HINTS = {
    "embeddings": [{"name": "embedding", "rows": BIG_VOCAB, "dim": BIG_DIM}],
    "optimizer": "adagrad",
    "maxShardBytes": 64 << 20,
}
ENDLESS_CHECKPOINT_STEPS = 40
CHIEF_RESTARTS = 3
PS_MEMORY_BOUND = 1.10


def apply_endless(kubeconfig: Path, namespace: str, model: list[str] | None = None) -> str:
    """The example training without end (checkpoints every 40 steps), with no evaluator, and with
    `model`'s flags instead of the example's model size if given."""
    docs = example.manifests(namespace, 1_000_000, None, ENDLESS_CHECKPOINT_STEPS)
    job = next(d for d in docs if d["kind"] == "PSTrainingJob")
    chief = job["spec"]["chief"]["template"]["spec"]["containers"][0]
    if model:
        chief["args"] = [a for a in chief["args"] if not a.startswith(("--vocab-size", "--embedding-dim"))]
        chief["args"] += model
    del job["spec"]["evaluator"]
    job["spec"]["failurePolicy"]["maxRestarts"] = CHIEF_RESTARTS
    kubectl(kubeconfig, "apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump_all(docs))
    return str(job["metadata"]["name"])


def working_set_mib(kubeconfig: Path, namespace: str) -> dict[str, tuple[float, float]]:
    """Every trainer container's working set in the namespace (MiB), from each kubelet's resource
    metrics, with when the kubelet measured it: it serves its last stats, taken every 10 to 15 s."""
    nodes = kubectl(kubeconfig, "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").split()
    resource = [f"/api/v1/nodes/{node}/proxy/metrics/resource" for node in nodes]
    text = "\n".join(kubectl(kubeconfig, "get", "--raw", path) for path in resource)
    wanted = {"namespace": namespace, "container": "trainer"}
    return {
        sample.labels["pod"]: (sample.value / 2**20, float(sample.timestamp or 0))
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "container_memory_working_set_bytes"
        and all(sample.labels.get(k) == v for k, v in wanted.items())
    }


def ps_working_sets_after(kubeconfig: Path, namespace: str, since: float, ps: int) -> dict[str, float]:
    """The working set (MiB) of each of the `ps` parameter servers, measured after `since`: a stat
    taken before would be of a PS that has not restored the model yet."""

    def measured() -> dict[str, float] | None:
        sets = working_set_mib(kubeconfig, namespace).items()
        fresh = {pod: mib for pod, (mib, at) in sets if "-ps-" in pod and at >= since}
        return fresh if len(fresh) == ps else None

    return wait_for(measured, timeout=60, interval=2, message=f"{ps} PS working sets measured after {since}")


def ps_uids(api: client.ApiClient, namespace: str, name: str) -> set[str]:
    return {p["metadata"]["uid"] for p in psjobs.live_pods(api, namespace, name, "ps")}


def replaced(api: client.ApiClient, namespace: str, name: str, served: set[str]) -> None:
    """None of the parameter servers that served the old chief is left."""
    wait_for(
        lambda: not ps_uids(api, namespace, name) & served,
        timeout=120,
        message="the parameter servers restarted with the chief",
    )


def chief_checkpoint(
    api: client.ApiClient, namespace: str, name: str, attempt: int, after: int
) -> tuple[Obj, Obj]:
    """The chief pod of `attempt` once it reports a checkpoint past `after`, with that report."""

    def reported() -> tuple[Obj, Obj] | None:
        for pod in psjobs.live_pods(api, namespace, name, "chief"):
            if pod["metadata"]["labels"].get("psoperator.io/attempt") != str(attempt):
                continue
            try:
                report = progress(api, pod) if pod["status"].get("podIP") else {}
            except OSError:  # not serving yet
                continue
            if report.get("checkpointStep", -1) > after:
                return pod, report
        return None

    message = f"chief {attempt}'s checkpoint past step {after}"
    return wait_for(reported, timeout=TRAIN_TIMEOUT, interval=1, message=message)


def test_chief_restarts_restart_the_ps_too_and_their_memory_stays_flat(
    kubeconfig: Path, k8s: client.ApiClient, job_namespace: str, figures: Figures
) -> None:
    """Chiefs SIGKILLed in a row, each after its next checkpoint (three restarts: each copy kept
    would add about a third to a PS's working set, three times the bound's 10%): the operator
    restarts the parameter servers with every new chief, so each holds one copy of the model, not
    one per chief, within what the sizing planner gives a PS of this model."""
    name = apply_endless(kubeconfig, job_namespace, BIG_MODEL)
    memory: list[dict[str, float]] = []
    checkpoint = -1
    for attempt in range(CHIEF_RESTARTS + 1):
        chief, report = chief_checkpoint(k8s, job_namespace, name, attempt, checkpoint)
        # From the latest checkpoint: the one seen, or one the chief wrote before its SIGKILL landed.
        resumed = report.get("resumedFromStep")
        if attempt:
            assert resumed is not None and resumed >= checkpoint, report
            assert resumed % ENDLESS_CHECKPOINT_STEPS == 0, report
        else:
            assert resumed is None, report
        checkpoint = report["checkpointStep"]
        served = ps_uids(k8s, job_namespace, name)
        ps = ps_working_sets_after(kubeconfig, job_namespace, time.time(), len(served))
        memory.append(ps)
        figures.record(f"chief {attempt}: PS working set (MiB)", str({k: round(v) for k, v in ps.items()}))
        sigkill(chief)
        if attempt < CHIEF_RESTARTS:
            replaced(k8s, job_namespace, name, served)
    status = psjobs.status(k8s, job_namespace, name)
    assert status["restarts"] >= CHIEF_RESTARTS and status["lastFailure"]["role"] == "chief", status
    reasons = [e.reason for e in client.CoreV1Api(k8s).list_namespaced_event(job_namespace).items]
    assert reasons.count("RecyclingParameterServers") >= CHIEF_RESTARTS, reasons
    assert "ParameterServerLost" not in reasons and "PsFailed" not in reasons, reasons
    # The first restart's PS restored the model: the bound is against them.
    for later in memory[2:]:
        for pod, mib in later.items():
            assert mib <= PS_MEMORY_BOUND * memory[1][pod], (pod, memory[1], later)
    # The planner sizes for what a PS holds after a restore, with its headroom.
    need = plan_ps(ModelHints.model_validate(BIG_MODEL_HINTS), num_ps=2).per_ps_bytes / 2**20
    held = max(mib for one in memory for mib in one.values())
    figures.record("PS working set, most of any chief / planned per PS (MiB)", f"{held:.0f} / {need:.0f}")
    assert held <= need, (memory, need)


def test_prometheus_scrapes_the_chiefs_own_metrics(
    kubeconfig: Path, k8s: client.ApiClient, job_namespace: str, tmp_path: Path
) -> None:
    """A real Prometheus scrapes the training chief's /metrics on its progress port: the target the
    chart's trainer PodMonitor gives it (the pod's `progress` port), forwarded to this machine."""
    name = apply_endless(kubeconfig, job_namespace)
    chief, _ = chief_checkpoint(k8s, job_namespace, name, 0, -1)
    with port_forward(kubeconfig, job_namespace, chief["metadata"]["name"], DEFAULT_PROGRESS_PORT) as port:
        prometheus = monitoring.PrometheusProcess(tmp_path, f"127.0.0.1:{port}", {"groups": []})
        prometheus.start()
        try:

            def value(expr: str) -> float:
                return max(prometheus.query(expr).values(), default=0.0)

            saves = wait_for(
                lambda: value("pstrainer_checkpoint_save_seconds_count"),
                timeout=120,
                message="a checkpoint save",
            )
            step = wait_for(lambda: value("pstrainer_global_step"), timeout=60, message="a step")
            wait_for(
                lambda: value("pstrainer_global_step") > step, timeout=120, message=f"the step past {step}"
            )
            assert value("pstrainer_step_seconds_count") > 0 and value("pstrainer_examples_per_second") > 0
            assert value("pstrainer_last_checkpoint_step") >= ENDLESS_CHECKPOINT_STEPS and saves >= 1
        finally:
            prometheus.stop()
    kubectl(kubeconfig, "delete", "psjob", name, "-n", job_namespace, "--wait=false")

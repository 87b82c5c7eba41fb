"""Recovery that knows the roles, row by row of the matrix, against the real control plane.

Failures are injected through e2e/chaos.py; the real StatefulSet and Job controllers react to them
as they would to a kubelet's report, and the operator must react on top.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kubernetes import client, watch

from e2e import chaos, psjobs
from e2e.accounts import CHART_NAMESPACE
from e2e.operator_process import OperatorProcess
from e2e.util import as_json, condition, holds_for, wait_for
from psoperator.faults import FAULT_ENV, FAULT_EXIT_CODE, Fault

Obj = dict[str, Any]
# "Within seconds": the operator reacts to the pod event; the budget covers a slow CI machine.
RESTART_BUDGET_SECONDS = 10.0

# Failure injection and loopback pod IPs need KWOK's simulated nodes.
pytestmark = pytest.mark.usefixtures("kwok_only")


def _start(k8s: client.ApiClient, namespace: str, **spec: Any) -> tuple[Obj, Obj]:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", **spec))
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    # Running means every PS ran under this chief: the next PS loss loses variables.
    wait_for(
        lambda: psjobs.status(k8s, namespace, "ctr")["tracking"]["psEstablished"],
        timeout=30,
        message="PS established",
    )
    return psjobs.running_pod(k8s, namespace, "ctr", "chief"), psjobs.status(k8s, namespace, "ctr")


def _new_chief(k8s: client.ApiClient, namespace: str, old_uid: str, attempt: int) -> Obj:
    def find() -> Obj | None:
        for pod in psjobs.live_pods(k8s, namespace, "ctr", "chief"):
            labels = pod["metadata"]["labels"]
            if pod["metadata"]["uid"] != old_uid and labels.get(psjobs.LABEL_ATTEMPT) == str(attempt):
                return pod
        return None

    return wait_for(find, timeout=RESTART_BUDGET_SECONDS, message=f"a chief pod of attempt {attempt}")


def test_worker_failure_leaves_the_chief_alone(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    chief, _ = _start(k8s, namespace)
    worker = psjobs.running_pod(k8s, namespace, "ctr", "worker", 1)
    # 138: retryable (exit 1, a bug in user code, would fail the job: workerPermanentExit FailJob).
    chaos.fail_container(k8s, namespace, worker["metadata"]["name"], exit_code=138)

    wait_for(
        lambda: (psjobs.status(k8s, namespace, "ctr").get("lastFailure") or {}).get("role") == "worker",
        timeout=20,
        message="the worker failure recorded",
    )
    status = psjobs.status(k8s, namespace, "ctr")
    assert status["lastFailure"]["index"] == 1 and status["lastFailure"]["exitCode"] == 138
    assert status["replicaStatuses"]["worker"]["restarts"] >= 1
    # The StatefulSet replaces the worker; the chief keeps running, nothing restarts.
    wait_for(
        lambda: (
            psjobs.running_pod(k8s, namespace, "ctr", "worker", 1)["metadata"]["uid"]
            != worker["metadata"]["uid"]
        ),
        timeout=30,
        message="worker replaced",
    )
    holds_for(
        lambda: (
            psjobs.status(k8s, namespace, "ctr").get("restarts") == 0
            and psjobs.status(k8s, namespace, "ctr").get("phase") == "Running"
        ),
        duration=3,
    )
    assert psjobs.running_pod(k8s, namespace, "ctr", "chief")["metadata"]["uid"] == chief["metadata"]["uid"]
    assert "WorkerFailed" in {e.reason for e in psjobs.events(k8s, namespace, "ctr")}


def test_ps_failure_restarts_the_chief_within_seconds(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    chief, _ = _start(k8s, namespace)
    ps = psjobs.running_pod(k8s, namespace, "ctr", "ps", 0)
    started = time.monotonic()
    chaos.fail_container(k8s, namespace, ps["metadata"]["name"], exit_code=137, reason="OOMKilled")
    _new_chief(k8s, namespace, chief["metadata"]["uid"], attempt=1)
    elapsed = time.monotonic() - started
    print(f"PS failure -> new chief pod: {elapsed:.2f}s")
    assert elapsed < RESTART_BUDGET_SECONDS

    status = psjobs.status(k8s, namespace, "ctr")
    assert (status["restarts"], status["countedRestarts"]) == (1, 1)
    assert status["lastFailure"]["role"] == "ps" and status["lastFailure"]["reason"] == "OOMKilled"
    assert "memory" in status["lastFailure"]["message"]  # the planner's suggestion
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=60)
    assert condition(status, "Restarting")["status"] == "False"  # type: ignore[index]
    assert "ParameterServerLost" in {e.reason for e in psjobs.events(k8s, namespace, "ctr")}


def test_ps_restarted_in_place_restarts_the_chief(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    chief, _ = _start(k8s, namespace)
    ps = psjobs.running_pod(k8s, namespace, "ctr", "ps", 1)
    chaos.restart_container(k8s, namespace, ps["metadata"]["name"], exit_code=138)
    _new_chief(k8s, namespace, chief["metadata"]["uid"], attempt=1)
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=60)
    assert status["restarts"] == 1 and status["lastFailure"]["index"] == 1
    # The same PS pod, restarted in place, did not trigger a second restart.
    holds_for(lambda: psjobs.status(k8s, namespace, "ctr")["restarts"] == 1, duration=3)


def test_preempted_ps_restarts_without_counting(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    chief, _ = _start(k8s, namespace)
    chaos.preempt_pod(k8s, namespace, psjobs.running_pod(k8s, namespace, "ctr", "ps", 0)["metadata"]["name"])
    _new_chief(k8s, namespace, chief["metadata"]["uid"], attempt=1)
    status = psjobs.status(k8s, namespace, "ctr")
    assert (status["restarts"], status["countedRestarts"]) == (1, 0), status.get("lastFailure")
    assert status["lastFailure"]["reason"] == "Preempted"


def test_permanent_exit_code_fails_the_job_and_cleans_up(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    chief, _ = _start(k8s, namespace)
    chaos.fail_container(k8s, namespace, chief["metadata"]["name"], exit_code=2, message="bad flag --steps")
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Failed", timeout=30)
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == "PermanentExitCode"
    assert status["lastFailure"]["exitCode"] == 2 and status["restarts"] == 0
    # cleanPodPolicy All: parameter servers and workers are stopped.
    apps = client.AppsV1Api(k8s)
    wait_for(
        lambda: (
            apps.read_namespaced_stateful_set("ctr-ps", namespace).spec.replicas == 0
            and not psjobs.live_pods(k8s, namespace, "ctr", "worker")
        ),
        timeout=30,
        message="pods cleaned",
    )


def test_retryable_chief_exit_restarts_until_the_budget_runs_out_and_progress_resets_it(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    chief, _ = _start(k8s, namespace, failurePolicy={"maxRestarts": 1})
    # 1st failure, no checkpoint yet: counted (1 of 1).
    chaos.fail_container(k8s, namespace, chief["metadata"]["name"], exit_code=138)
    chief = _new_chief(k8s, namespace, chief["metadata"]["uid"], attempt=1)
    assert psjobs.status(k8s, namespace, "ctr")["countedRestarts"] == 1
    # 2nd failure after a newer checkpoint (the runtime's termination message): not counted.
    report = json.dumps({"state": "failed", "step": 120, "checkpointStep": 100, "exitCode": 138})
    psjobs.running_pod(k8s, namespace, "ctr", "chief")
    chaos.fail_container(k8s, namespace, chief["metadata"]["name"], exit_code=138, message=report)
    chief = _new_chief(k8s, namespace, chief["metadata"]["uid"], attempt=2)
    status = psjobs.status(k8s, namespace, "ctr")
    assert (status["restarts"], status["countedRestarts"], status["checkpoint"]["step"]) == (2, 0, 100)
    # 3rd and 4th without progress: the 4th exceeds maxRestarts.
    psjobs.running_pod(k8s, namespace, "ctr", "chief")
    chaos.fail_container(k8s, namespace, chief["metadata"]["name"], exit_code=138)
    chief = _new_chief(k8s, namespace, chief["metadata"]["uid"], attempt=3)
    psjobs.running_pod(k8s, namespace, "ctr", "chief")
    chaos.fail_container(k8s, namespace, chief["metadata"]["name"], exit_code=138)
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Failed", timeout=30)
    assert condition(status, "Failed")["reason"] == "RestartsExhausted"  # type: ignore[index]


@pytest.mark.parametrize("resume", ["once-the-pods-are-gone", "at-once"])
def test_suspend_and_resume(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess, resume: str
) -> None:
    """Resumed at once (the chaos run does), the chief's pods may still be stopping: their ending is
    the suspension's, not a failure, and no restart is made."""
    _start(k8s, namespace)
    psjobs.patch_spec(k8s, namespace, "ctr", {"runPolicy": {"suspend": True}})
    psjobs.wait_phase(k8s, namespace, "ctr", "Suspended", timeout=30)
    if resume == "once-the-pods-are-gone":
        wait_for(
            lambda: not any(psjobs.live_pods(k8s, namespace, "ctr", r) for r in ("chief", "ps", "worker")),
            timeout=60,
            message="no pods while suspended",
        )
    # KWOK's chief serves no progress port (a plain TensorFlow image neither): no checkpoint is
    # waited for, and the status says why.
    stop = psjobs.status(k8s, namespace, "ctr")["lastPlannedStop"]
    assert stop["cause"] == "Suspend" and "does not serve" in stop["reason"], stop
    psjobs.patch_spec(k8s, namespace, "ctr", {"runPolicy": {"suspend": False}})
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    assert condition(status, "Suspended")["reason"] == "Resumed"  # type: ignore[index]
    wait_for(lambda: psjobs.status(k8s, namespace, "ctr")["tracking"]["psEstablished"], timeout=30)
    holds_for(lambda: psjobs.status(k8s, namespace, "ctr")["restarts"] == 0, duration=5)


LIVE = ("Pending", "Running")


class ChiefPods:
    """A job's chief pods as a watch shows them, every change in order: the most that were Pending
    or Running at once (being deleted or not: a pod in its grace period still runs)."""

    def __init__(self, api: client.ApiClient, namespace: str, job: str) -> None:
        self.core = client.CoreV1Api(api)
        self.selector = f"{psjobs.LABEL_JOB}={job},{psjobs.LABEL_ROLE}=chief"
        listed = as_json(api, self.core.list_namespaced_pod(namespace, label_selector=self.selector))
        self.live: dict[str, str] = {}  # uid -> name, of the pods Pending or Running
        self.seen: list[str] = []
        self.most = 0
        for pod in listed["items"]:
            self._note(pod, "LISTED")
        self.error: Exception | None = None
        self.closed = False
        self._watch = watch.Watch()  # type: ignore[no-untyped-call]
        since = listed["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, args=(namespace, since), daemon=True)
        self._thread.start()

    def _run(self, namespace: str, since: str | None) -> None:
        try:
            for event in self._watch.stream(  # type: ignore[no-untyped-call]
                self.core.list_namespaced_pod,
                namespace,
                label_selector=self.selector,
                resource_version=since,
                timeout_seconds=300,
            ):
                self._note(event["raw_object"], event["type"])
        except Exception as error:  # the checks report what was seen
            if not self.closed:  # stopping the watch cuts its stream
                self.error = error

    def _note(self, pod: Obj, change: str) -> None:
        meta, phase = pod["metadata"], pod.get("status", {}).get("phase")
        if change != "DELETED" and phase in LIVE:
            self.live[meta["uid"]] = meta["name"]
        else:
            self.live.pop(meta["uid"], None)
        self.most = max(self.most, len(self.live))
        deleting = " deleting" if meta.get("deletionTimestamp") else ""
        self.seen.append(f"{change} {meta['name']} {meta['uid'][:8]} {phase}{deleting}")

    def close(self) -> None:
        self.closed = True
        self._watch.stop()  # type: ignore[no-untyped-call]
        self._thread.join(timeout=10)


# The chief pod of a chief Job deleted by a suspension, by a suspension whose own deletion of the
# pod fails until after the resume, or by hand.
LEFT_CHIEF = ["suspended", "resumed-before-its-deletion", "deleted-by-hand"]


@pytest.mark.parametrize("how", LEFT_CHIEF)
def test_a_chief_pod_left_by_its_deleted_job_is_deleted_before_a_new_chief_starts(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess, how: str
) -> None:
    """Never two chiefs: a deleted chief Job leaves its pod to the garbage collector, which may lag
    (it re-lists after an API server restart). Here it cannot delete the pod at all: a suspension
    deletes it itself, and a chief Job made again for the same attempt waits until it is gone, and
    the operator deletes it (only once the API server lets it)."""
    chief, _ = _start(k8s, namespace)
    batch = client.BatchV1Api(k8s)
    old_job = as_json(k8s, batch.read_namespaced_job("ctr-chief", namespace))["metadata"]["uid"]
    labels = {psjobs.LABEL_JOB: "ctr", psjobs.LABEL_ROLE: "chief"}
    operator_accounts = f"system:serviceaccount:{CHART_NAMESPACE}:"
    allowed = None if how == "resumed-before-its-deletion" else operator_accounts
    pods = ChiefPods(k8s, namespace, "ctr")
    try:
        with chaos.pod_deletion_refused(k8s, namespace, labels, chief["metadata"]["name"], allowed) as allow:
            if how == "deleted-by-hand":
                batch.delete_namespaced_job("ctr-chief", namespace, propagation_policy="Background")
            else:
                psjobs.patch_spec(k8s, namespace, "ctr", {"runPolicy": {"suspend": True}})
                psjobs.wait_phase(k8s, namespace, "ctr", "Suspended", timeout=30)
            if how == "suspended":  # its chief does not run on while the garbage collector lags
                wait_for(lambda: not pods.live, timeout=30, message=lambda: f"no chief pod; {pods.seen}")
            if how != "deleted-by-hand":
                psjobs.patch_spec(k8s, namespace, "ctr", {"runPolicy": {"suspend": False}})
            if how == "resumed-before-its-deletion":
                psjobs.wait_phase(k8s, namespace, "ctr", "Creating", timeout=30)
                holds_for(
                    lambda: pods.live == {chief["metadata"]["uid"]: chief["metadata"]["name"]},
                    duration=5,
                    message=lambda: f"the old chief alone, refused its deletion; {pods.seen}",
                )
                allow(operator_accounts)

            def new_chief() -> bool:
                job = as_json(k8s, batch.read_namespaced_job("ctr-chief", namespace))["metadata"]["uid"]
                return job != old_job and any(
                    pod["status"].get("phase") == "Running"
                    and job in {r["uid"] for r in pod["metadata"].get("ownerReferences") or []}
                    for pod in psjobs.live_pods(k8s, namespace, "ctr", "chief")
                )

            wait_for(new_chief, timeout=90, message=lambda: f"a chief of a new Job; chief pods {pods.seen}")
            psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=60)
    finally:
        pods.close()
    assert pods.error is None and pods.most == 1, pods.seen
    status = psjobs.status(k8s, namespace, "ctr")
    assert (status["restarts"], status.get("lastFailure")) == (0, None), status


def test_deadline_fails_a_job_that_runs_too_long(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    psjobs.create(k8s, namespace, psjobs.manifest("ctr", runPolicy={"activeDeadlineSeconds": 8}))
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Failed", timeout=60)
    assert condition(status, "Failed")["reason"] == "DeadlineExceeded"  # type: ignore[index]


def test_success_cleans_up_then_ttl_deletes_the_job(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    evaluator = {"template": {"spec": {"containers": [{"name": "trainer"}]}}}
    chief, _ = _start(k8s, namespace, evaluator=evaluator, runPolicy={"ttlSecondsAfterFinished": 5})
    assert psjobs.live_pods(k8s, namespace, "ctr", "evaluator")
    chaos.complete_pod(k8s, namespace, chief["metadata"]["name"])
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Succeeded", timeout=30)
    assert status["completionTime"]
    assert condition(status, "Succeeded")["reason"] == "ChiefCompleted"  # type: ignore[index]
    # cleanPodPolicy All: parameter servers, workers and the evaluator stop.
    wait_for(
        lambda: not any(psjobs.live_pods(k8s, namespace, "ctr", r) for r in ("ps", "worker", "evaluator")),
        timeout=30,
        message="pods of the other roles cleaned up",
    )
    assert "ChildRejected" not in {e.reason for e in psjobs.events(k8s, namespace, "ctr")}
    wait_for(lambda: psjobs.get(k8s, namespace, "ctr") is None, timeout=30, message="the job deleted by TTL")
    # Posted through kopf's real posting path (its level is WARNING: kopf.info would post nothing).
    wait_for(lambda: "Expired" in {e.reason for e in psjobs.events(k8s, namespace, "ctr")}, timeout=30,
             message="the Expired event")  # fmt: skip


def test_operator_killed_after_deciding_a_restart_finishes_it_once(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    chief, _ = _start(k8s, namespace)
    # The real crash window: the operator exits right after writing restarts=1, before it touches
    # the chief Job (PSOPERATOR_FAULT, a test hook in psoperator/faults.py).
    operator.stop()
    operator.extra_env = {FAULT_ENV: Fault.EXIT_AFTER_RESTART_STATUS_WRITE.value}
    operator.start()
    chaos.fail_container(
        k8s, namespace, psjobs.running_pod(k8s, namespace, "ctr", "ps", 1)["metadata"]["name"], 138
    )
    wait_for(lambda: not operator.running, timeout=30, message="the operator crashed at the fault point")
    assert operator.stop() == FAULT_EXIT_CODE
    status = psjobs.status(k8s, namespace, "ctr")
    assert (status["restarts"], status["phase"]) == (1, "Restarting")
    attempts = {
        p["metadata"]["labels"].get(psjobs.LABEL_ATTEMPT)
        for p in psjobs.live_pods(k8s, namespace, "ctr", "chief")
    }
    assert attempts == {"0"}, "the crash came before the chief Job was replaced"
    operator.extra_env = {}
    operator.start()
    _new_chief(k8s, namespace, chief["metadata"]["uid"], attempt=1)
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=60)
    holds_for(lambda: psjobs.status(k8s, namespace, "ctr")["restarts"] == 1, duration=3)


def test_operator_down_during_a_ps_failure_recovers_once_after_restart(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    chief, _ = _start(k8s, namespace)
    operator.kill()
    chaos.fail_container(
        k8s, namespace, psjobs.running_pod(k8s, namespace, "ctr", "ps", 1)["metadata"]["name"], 138
    )
    operator.start()
    _new_chief(k8s, namespace, chief["metadata"]["uid"], attempt=1)
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=60)
    holds_for(lambda: psjobs.status(k8s, namespace, "ctr")["restarts"] == 1, duration=3)


def test_a_ps_on_an_unreachable_node_waits_for_a_fence_then_the_chief_restarts(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """The PS's node stops reporting (Ready=Unknown): its pods may still run. After
    nodeLostTimeoutSeconds the job says so in its NodeLost condition and waits, deleting nothing and
    starting no chief. Once the node is tainted out of service, its pods are force-deleted, NodeLost
    is recorded (uncounted) and a new chief attempt starts."""
    _start(k8s, namespace, failurePolicy={"nodeLostTimeoutSeconds": 5})
    ps = psjobs.running_pod(k8s, namespace, "ctr", "ps", 1)
    node = ps["spec"]["nodeName"]

    def lost() -> Obj | None:
        return condition(psjobs.status(k8s, namespace, "ctr"), "NodeLost")

    def ps_kept() -> bool:
        kept = [p["metadata"]["uid"] for p in psjobs.live_pods(k8s, namespace, "ctr", "ps")]
        return ps["metadata"]["uid"] in kept and psjobs.status(k8s, namespace, "ctr").get("restarts", 0) == 0

    chaos.make_node_unreachable(k8s, node)
    try:
        told = wait_for(lambda: (c := lost()) and c["status"] == "True" and c, timeout=60, message="NodeLost")
        assert told["reason"] == "AwaitingFence" and f"node {node} " in told["message"], told
        assert ps["metadata"]["name"] in told["message"], told
        holds_for(ps_kept, duration=5, message="ps-1 kept, no restart, while its node is not fenced")
        chaos.fence_node(k8s, node)
        status = wait_for(
            lambda: (s := psjobs.status(k8s, namespace, "ctr")).get("restarts", 0) >= 1 and s,
            timeout=60,
            message=lambda: f"a NodeLost restart; status {psjobs.status(k8s, namespace, 'ctr')}",
        )
        assert status["lastFailure"]["reason"] == "NodeLost", status["lastFailure"]
        assert status["countedRestarts"] == 0
        wait_for(lambda: (c := lost()) and c["status"] == "False", timeout=30, message="NodeLost False")
    finally:
        chaos.unfence_node(k8s, node)
        chaos.make_node_ready(k8s, node)
    psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)


# Every field a running job lets change (connectTimeoutSeconds is in every pod's environment: the
# API server refuses it), each changed at once on a running job (suspend and the
# deadline have their own tests: their effect is to stop the job; so do the replicas and the PS
# resources: a resize restarts it).
MUTABLE_CHANGES: dict[str, Any] = {
    "failurePolicy": {
        "maxRestarts": 7,
        "permanentExitCodes": [1, 2, 3],
        "workerPermanentExit": "Record",
        "stallTimeoutSeconds": 3600,
        "schedulingTimeoutSeconds": 3600,
        "nodeLostTimeoutSeconds": 300,
        "startupErrorGraceSeconds": 600,
        "checkpointBeforeStopSeconds": 120,
    },
    "runPolicy": {"ttlSecondsAfterFinished": 3600, "cleanPodPolicy": "Running"},
}


def _failure_rules(k8s: client.ApiClient, namespace: str) -> Any:
    return as_json(k8s, client.BatchV1Api(k8s).read_namespaced_job("ctr-chief", namespace))["spec"][
        "podFailurePolicy"
    ]


def test_every_mutable_field_changes_a_running_job_without_a_warning_storm(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    chief, _ = _start(k8s, namespace)
    rules_before = _failure_rules(k8s, namespace)
    psjobs.patch_spec(k8s, namespace, "ctr", MUTABLE_CHANGES)
    generation = psjobs.get(k8s, namespace, "ctr")["metadata"]["generation"]  # type: ignore[index]
    wait_for(
        lambda: psjobs.status(k8s, namespace, "ctr").get("observedGeneration") == generation,
        timeout=30,
        message=f"generation {generation} observed",
    )
    # A few resyncs later: no child refused, no warning at all, and the same chief still running.
    holds_for(lambda: psjobs.status(k8s, namespace, "ctr").get("phase") == "Running", duration=12)
    events = psjobs.events(k8s, namespace, "ctr")
    warnings = [f"{e.reason}: {e.message}" for e in events if e.type == "Warning"]
    assert warnings == []
    assert psjobs.running_pod(k8s, namespace, "ctr", "chief")["metadata"]["uid"] == chief["metadata"]["uid"]
    # The exit codes reach the next chief attempt; the running chief Job keeps the rules it has
    # (the API server refuses to change them).
    assert _failure_rules(k8s, namespace) == rules_before
    assert psjobs.status(k8s, namespace, "ctr")["restarts"] == 0


def _statefulset_replicas(k8s: client.ApiClient, namespace: str) -> dict[str, int]:
    listed = as_json(k8s, client.AppsV1Api(k8s).list_namespaced_stateful_set(namespace))
    return {s["metadata"]["name"]: s["spec"]["replicas"] for s in listed["items"]}


@pytest.mark.parametrize(("ps", "workers"), [(3, 2), (1, 2), (2, 3), (2, 1)])
def test_a_resize_restarts_with_the_new_shape_and_counts_nothing(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess, ps: int, workers: int
) -> None:
    chief, _ = _start(k8s, namespace)
    spec = psjobs.get(k8s, namespace, "ctr")["spec"]  # type: ignore[index]
    psjobs.patch_spec(
        k8s,
        namespace,
        "ctr",
        {"ps": {**spec["ps"], "replicas": ps}, "worker": {**spec["worker"], "replicas": workers}},
    )
    _new_chief(k8s, namespace, chief["metadata"]["uid"], attempt=1)
    wait_for(
        lambda: _statefulset_replicas(k8s, namespace) == {"ctr-ps": ps, "ctr-worker": workers},
        timeout=30,
        message=f"the StatefulSets scaled to {ps} PS and {workers} workers",
    )
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    assert status["shape"] == {"ps": ps, "workers": workers, "psResources": {}}, status
    assert status["restarts"] == 1 and status["countedRestarts"] == 0 and "lastFailure" not in status, status
    assert status["psReady"] == f"{ps}/{ps}", status
    wait_for(
        lambda: len(psjobs.live_pods(k8s, namespace, "ctr", "worker")) == workers,
        timeout=60,
        message=f"{workers} workers",
    )
    # The new chief's TF_CONFIG lists the new cluster.
    new_chief = psjobs.running_pod(k8s, namespace, "ctr", "chief")
    env = {e["name"]: e.get("value") for e in new_chief["spec"]["containers"][0]["env"]}
    cluster = json.loads(env["TF_CONFIG"])["cluster"]
    assert (len(cluster["ps"]), len(cluster["worker"])) == (ps, workers), cluster
    reasons = [e.reason for e in psjobs.events(k8s, namespace, "ctr")]
    assert "Resized" in reasons and not {"PsFailed", "WorkerFailed", "ParameterServerLost"} & set(reasons)
    holds_for(lambda: psjobs.status(k8s, namespace, "ctr")["restarts"] == 1, duration=5)


def _ps_with_memory(memory: str) -> Obj:
    trainer = {"name": "trainer", "resources": {"requests": {"memory": memory}, "limits": {"memory": memory}}}
    return {"replicas": 2, "template": {"spec": {"containers": [trainer]}}}


def _ps_memory(pod: Obj) -> Any:
    return pod["spec"]["containers"][0]["resources"]


def test_more_ps_memory_restarts_the_ps_with_it_and_counts_nothing(
    k8s: client.ApiClient, namespace: str, operator: OperatorProcess
) -> None:
    """A job whose PS keep OOMing is given more memory: one restart (reason Resized), not counted,
    and every new PS pod has the new memory; the workers are kept."""
    chief, _ = _start(k8s, namespace, ps=_ps_with_memory("1Gi"))
    old_ps = {p["metadata"]["uid"] for p in psjobs.live_pods(k8s, namespace, "ctr", "ps")}
    workers = {p["metadata"]["uid"] for p in psjobs.live_pods(k8s, namespace, "ctr", "worker")}
    psjobs.patch_spec(k8s, namespace, "ctr", {"ps": _ps_with_memory("2Gi")})
    _new_chief(k8s, namespace, chief["metadata"]["uid"], attempt=1)
    status = psjobs.wait_phase(k8s, namespace, "ctr", "Running", timeout=90)
    wanted = {"requests": {"memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    assert status["shape"] == {"ps": 2, "workers": 2, "psResources": {"trainer": wanted}}, status
    assert status["restarts"] == 1 and status["countedRestarts"] == 0 and "lastFailure" not in status, status

    def new_ps() -> list[Obj] | None:
        pods = psjobs.live_pods(k8s, namespace, "ctr", "ps")
        fresh = len(pods) == 2 and not {p["metadata"]["uid"] for p in pods} & old_ps
        return pods if fresh else None

    ps = wait_for(new_ps, timeout=60, message="two new PS pods")
    assert [_ps_memory(p) for p in ps] == [wanted, wanted]
    restarting = condition(psjobs.status(k8s, namespace, "ctr"), "Restarting")
    assert restarting is not None and restarting["reason"] == "Recovered", restarting  # from Resized
    events = {e.reason: e.message for e in psjobs.events(k8s, namespace, "ctr")}
    assert events.get("Resized", "").startswith("from 2 PS (1Gi), 2 workers to 2 PS (2Gi), 2 workers"), events
    assert not {"PsFailed", "WorkerFailed", "ParameterServerLost"} & set(events), events
    assert {p["metadata"]["uid"] for p in psjobs.live_pods(k8s, namespace, "ctr", "worker")} == workers
    holds_for(lambda: psjobs.status(k8s, namespace, "ctr")["restarts"] == 1, duration=5)

"""The tracking memory in the job's status: typed records, and the strings earlier versions stored."""

from __future__ import annotations

from typing import Any

from psoperator.api.models import StartError, TrackedPod, Tracking
from psoperator.plan.stages import plan_reconcile
from tests.unit.builders import NOW, came_up, chief_job, job, observed, pod, running_cluster, with_status

BASE = running_cluster()


def _as_strings(pods: list[dict[str, Any]]) -> dict[str, str]:
    """The tracking of BASE as an earlier version stored it: "uid/restarts/sidecar restarts"."""
    tracked = [p for p in pods if p["metadata"]["labels"]["psoperator.io/role"] != "chief"]
    return {p["metadata"]["name"]: f"{p['metadata']['uid']}/0/0" for p in tracked}


def test_the_strings_an_earlier_version_stored_are_read_as_records() -> None:
    tracking = Tracking.model_validate(
        {
            "psEstablished": True,
            "pods": {"ctr-ps-0": "uid-a/2/1", "ctr-worker-0": "uid-b/3", "typed": {"uid": "uid-c"}},
            "startErrors": {
                "ctr-ps-1": "uid-d/1/2026-11-29T11:55:00Z/told",
                "ctr-worker-1": "uid-e/0/2026-11-29T11:59:00Z",
                "garbled": "nonsense",
            },
        }
    )
    assert tracking.pods == {
        "ctr-ps-0": TrackedPod(uid="uid-a", restarts=2, sidecarRestarts=1),
        "ctr-worker-0": TrackedPod(uid="uid-b", restarts=3),
        "typed": TrackedPod(uid="uid-c"),
    }
    assert tracking.start_errors == {
        "ctr-ps-1": StartError(uid="uid-d", restarts=1, since="2026-11-29T11:55:00Z", told=True),
        "ctr-worker-1": StartError(uid="uid-e", restarts=0, since="2026-11-29T11:59:00Z"),
    }


def test_a_job_running_through_the_upgrade_keeps_its_tracking_and_stores_records() -> None:
    running = with_status(job(), **came_up(phase="Running", tracking={"psEstablished": True}))
    running["status"]["tracking"]["pods"] = _as_strings(BASE)
    quiet = plan_reconcile(running, observed(BASE, chief_job(0)), None, NOW)
    assert not quiet.restarted and not quiet.failures
    assert quiet.status["tracking"]["pods"]["ctr-ps-0"] == {
        "uid": "ctr-ps-0-uid",
        "restarts": 0,
        "sidecarRestarts": 0,
    }
    lost = [p if p["metadata"]["name"] != "ctr-ps-1" else pod("ps", 1, uid="fresh") for p in BASE]
    restart = plan_reconcile(running, observed(lost, chief_job(0)), None, NOW)
    assert restart.restarted and restart.failures == [("ps", "Replaced")]


def test_a_disruption_seen_is_recorded_so_the_pods_loss_is_never_counted_unseen() -> None:
    """A PS marked for preemption (DisruptionTarget, still running) and then gone while the operator
    was away (a restart, a failover: its memory of departed pods is empty) is a disruption, read
    from the status: no counted restart, where an unexplained replacement would count."""
    running = with_status(job(), **came_up(phase="Running", restarts=0, countedRestarts=0))
    running["status"]["tracking"] = {"psEstablished": True, "pods": _as_strings(BASE)}
    marked = [p if p["metadata"]["name"] != "ctr-ps-1" else pod("ps", 1, disruption="PreemptionByScheduler")
              for p in BASE]  # fmt: skip
    seen = plan_reconcile(running, observed(marked, chief_job(0)), None, NOW)
    assert not seen.restarted and not seen.failures and seen.write_now
    assert seen.status["tracking"]["pods"]["ctr-ps-1"]["disruption"] == "PreemptionByScheduler"

    later = with_status(job(), **{**running["status"], "tracking": seen.status["tracking"]})
    replaced = [p if p["metadata"]["name"] != "ctr-ps-1" else pod("ps", 1, uid="fresh") for p in BASE]
    restart = plan_reconcile(later, observed(replaced, chief_job(0)), None, NOW)
    assert restart.restarted and restart.failures == [("ps", "Preempted")]
    assert restart.status["countedRestarts"] == 0 and restart.status["restarts"] == 1

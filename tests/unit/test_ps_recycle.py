"""Which parameter servers restart with the chief, and until when the new chief waits for them."""

from __future__ import annotations

from psoperator.api.models import Tracking
from psoperator.policies import ps_recycle
from tests.unit.builders import observed, pod, running_cluster, tracking_of

BASE = running_cluster()


def test_every_ps_unchanged_since_the_last_reconcile_served_the_old_chief() -> None:
    tracking = Tracking.model_validate(tracking_of(BASE))
    assert ps_recycle.serving_previous_chief(tracking, observed(BASE)) == {
        "ctr-ps-0": "ctr-ps-0-uid",
        "ctr-ps-1": "ctr-ps-1-uid",
    }


def test_a_ps_that_is_new_restarted_in_place_or_ended_is_not_recycled() -> None:
    tracking = Tracking.model_validate(tracking_of(BASE))
    replaced = [pod("ps", 0, uid="new"), pod("ps", 1, restarts=1), pod("worker", 0)]
    assert ps_recycle.serving_previous_chief(tracking, observed(replaced)) == {}
    ended = [pod("ps", 0, phase="Failed"), pod("ps", 1, phase="Failed", deleting=True)]
    assert ps_recycle.serving_previous_chief(tracking, observed(ended)) == {}


def test_a_ps_being_deleted_while_it_still_serves_is_waited_for() -> None:
    """A drained PS serves out its drain after its SIGTERM: the new chief must not connect to it."""
    tracking = Tracking.model_validate(tracking_of(BASE))
    draining = [pod("ps", 0, deleting=True), pod("ps", 1)]
    assert ps_recycle.serving_previous_chief(tracking, observed(draining)) == {
        "ctr-ps-0": "ctr-ps-0-uid",
        "ctr-ps-1": "ctr-ps-1-uid",
    }
    # Not tracked yet (the first reconcile that sees it): it never met a chief the operator knew.
    assert ps_recycle.serving_previous_chief(Tracking(), observed(BASE)) == {}


def test_the_chief_waits_while_a_recycled_pod_exists_even_while_it_terminates() -> None:
    recycling = {"ctr-ps-0": "ctr-ps-0-uid", "ctr-ps-1": "ctr-ps-1-uid"}
    terminating = [pod("ps", 0, deleting=True), pod("ps", 1, uid="new-1")]
    assert ps_recycle.still_there(recycling, observed(terminating)) == {"ctr-ps-0": "ctr-ps-0-uid"}
    assert ps_recycle.still_there(recycling, observed([pod("ps", 0, uid="new-0")])) == {}


def test_the_new_chief_waits_until_every_ps_of_its_attempt_runs() -> None:
    assert ps_recycle.not_running(2, observed(BASE)) == []
    coming = [pod("ps", 0, phase="Pending", ip=None), pod("ps", 1, deleting=True), pod("worker", 0)]
    assert ps_recycle.not_running(2, observed(coming)) == [0, 1]
    assert ps_recycle.not_running(3, observed([pod("ps", 0), pod("ps", 1, phase="Failed")])) == [1, 2]
    # A simulated node's pod may run with no address shown: it runs, the chief goes ahead.
    assert ps_recycle.not_running(1, observed([pod("ps", 0, ip=None)])) == []


def test_the_event_names_the_pods_and_says_it_is_not_a_failure() -> None:
    text = ps_recycle.describe({"ctr-ps-1": "b", "ctr-ps-0": "a"})
    assert text.startswith("ctr-ps-0, ctr-ps-1 restart with the chief, not for a failure")

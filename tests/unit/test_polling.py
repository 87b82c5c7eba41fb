"""The back-off of progress polls after a chief's port refused (polling.py)."""

from __future__ import annotations

from psoperator.control import polling


def test_a_chief_that_never_refused_is_always_asked() -> None:
    assert polling.due(None, "pod-a", 0.0)


def test_each_refusal_in_a_row_doubles_the_wait_up_to_its_limit() -> None:
    refusals, waits = None, []
    for _ in range(10):
        refusals = polling.refused(refusals, "pod-a", 100.0)
        waits.append(refusals.until - 100.0)
    assert waits[:4] == [5.0, 10.0, 20.0, 40.0]
    assert max(waits) == polling.MAX_WAIT_SECONDS == waits[-1]


def test_a_refused_chief_is_asked_again_once_its_wait_is_over() -> None:
    refusals = polling.refused(None, "pod-a", 100.0)
    assert not polling.due(refusals, "pod-a", 104.9)
    assert polling.due(refusals, "pod-a", 105.0)


def test_a_new_chief_pod_is_asked_at_once_and_starts_from_the_first_wait() -> None:
    refusals = polling.refused(polling.refused(None, "pod-a", 0.0), "pod-a", 0.0)
    assert polling.due(refusals, "pod-b", 0.0)
    assert polling.refused(refusals, "pod-b", 0.0).count == 1

"""Leader election: who may hold the Lease, when it has expired by this replica's own clock, and how
an elector steps up and down (against a fake of the two Lease calls)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from psoperator.control.leader import Election, Elector, LeaseClock, LeaseRecord, lease_body, may_hold
from tests.unit.builders import NOW

Obj = dict[str, Any]


def lease(holder: str | None, renewed: str = "2026-11-29T12:00:00.000000Z", version: str = "7") -> Obj:
    spec: Obj = {"leaseDurationSeconds": 8, "renewTime": renewed, "leaseTransitions": 3}
    if holder:
        spec.update(holderIdentity=holder, acquireTime="2026-11-29T11:00:00.000000Z")
    return {"metadata": {"name": "psop", "namespace": "ops", "resourceVersion": version}, "spec": spec}


def test_a_free_lease_or_our_own_may_be_held_one_of_another_only_once_expired() -> None:
    clock = LeaseClock()
    theirs = LeaseRecord.parse(lease("b"))
    clock.observe(theirs, now=100.0)
    assert may_hold(None, "a", clock, 8, 100.0)
    assert may_hold(LeaseRecord.parse(lease(None)), "a", clock, 8, 100.0)
    assert may_hold(LeaseRecord.parse(lease("a")), "a", clock, 8, 100.0)
    assert not may_hold(theirs, "a", clock, 8, 107.9)
    assert may_hold(theirs, "a", clock, 8, 108.1)


def test_expiry_runs_from_when_this_replica_saw_the_lease_change_not_from_its_renew_time() -> None:
    """A renewTime written by a machine whose clock is a day behind is not an expired lease."""
    clock = LeaseClock()
    clock.observe(LeaseRecord.parse(lease("b", renewed="2026-11-28T12:00:00.000000Z")), now=100.0)
    record = LeaseRecord.parse(lease("b", renewed="2026-11-28T12:00:02.000000Z"))
    clock.observe(record, now=106.0)  # renewed: the clock starts again
    assert record is not None and not clock.expired(record, 8, 113.0) and clock.expired(record, 8, 114.1)


def test_taking_a_lease_counts_a_transition_and_renewing_keeps_the_acquire_time() -> None:
    theirs = LeaseRecord.parse(lease("b"))
    taken = lease_body("psop", "ops", "a", 8, NOW, theirs)
    assert taken["spec"]["holderIdentity"] == "a" and taken["spec"]["leaseTransitions"] == 4
    assert taken["spec"]["acquireTime"] == taken["spec"]["renewTime"] == "2026-11-29T12:00:00.000000Z"
    assert taken["metadata"]["resourceVersion"] == "7"  # replaced only if nobody wrote it meanwhile
    renewed = lease_body("psop", "ops", "a", 8, NOW, LeaseRecord.parse(lease("a")))
    assert renewed["spec"]["leaseTransitions"] == 3
    assert renewed["spec"]["acquireTime"] == "2026-11-29T11:00:00.000000Z"
    assert "resourceVersion" not in lease_body("psop", "ops", "a", 8, NOW, None)["metadata"]


class FakeLeases:
    """The two Lease calls of Kube: one stored Lease, optimistic concurrency, an outage switch."""

    def __init__(self) -> None:
        self.stored: Obj | None = None
        self.version = 0
        self.down = False
        self.stalled: threading.Event | None = None  # set: the GET answers (a half-open connection)

    def get_lease(self, namespace: str, name: str) -> Obj | None:
        if self.stalled is not None:
            self.stalled.wait(timeout=30)
        if self.down:
            raise ConnectionError("API server unreachable")
        return self.stored

    def write_lease(self, body: Obj) -> bool:
        if self.down:
            raise ConnectionError("API server unreachable")
        current = self.stored["metadata"]["resourceVersion"] if self.stored else None
        if body["metadata"].get("resourceVersion") != current:
            return False
        self.version += 1
        self.stored = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}
        return True


def elector(leases: FakeLeases, events: list[str], name: str, duration: int = 8) -> Elector:
    async def lead() -> None:
        events.append(f"{name} leads")

    async def follow() -> None:
        events.append(f"{name} follows")

    made = Elector(leases, Election("ops", "psop", duration), lead, follow)  # type: ignore[arg-type]
    made.me = name
    return made


def test_one_leads_the_other_takes_over_once_the_lease_expired_and_the_first_steps_down() -> None:
    leases, events = FakeLeases(), list[str]()
    a, b = elector(leases, events, "a"), elector(leases, events, "b")

    async def scenario() -> None:
        await a.step(0.0)
        await b.step(0.5)
        await b.step(8.0)  # not expired yet, by b's clock
        await b.step(8.6)  # expired: a stopped renewing (killed, partitioned)
        await a.step(9.0)  # a is back: it sees b holding the Lease and stops at once

    asyncio.run(scenario())
    assert events == ["a leads", "b leads", "a follows"]
    assert leases.stored is not None and leases.stored["spec"]["holderIdentity"] == "b"


@pytest.mark.parametrize(("outage", "still_leading"), [(5.0, True), (5.5, False)])
def test_a_leader_that_cannot_renew_steps_down_at_its_renew_deadline(
    outage: float, still_leading: bool
) -> None:
    """The renew deadline (2/3 of 8 s) is shorter than the Lease: it stops before anyone may take over."""
    leases, events = FakeLeases(), list[str]()
    a = elector(leases, events, "a")

    async def scenario() -> None:
        await a.step(0.0)
        leases.down = True
        await a.step(outage)

    asyncio.run(scenario())
    assert a.leading is still_leading
    assert events == ["a leads"] + ([] if still_leading else ["a follows"])


def test_a_lease_request_that_never_answers_is_a_lost_renew_at_the_renew_deadline() -> None:
    """A half-open connection: the Lease GET hangs (30 s, retried). The leader stops its loops when
    its renew deadline passes, before another replica may take the Lease over, not when it answers."""
    leases, events = FakeLeases(), list[str]()
    a = elector(leases, events, "a", duration=2)  # renew deadline: 1.3 s, ample for the first step

    async def scenario() -> float:
        await a.step(time.monotonic())
        leases.stalled = threading.Event()
        started = time.monotonic()
        try:
            await asyncio.wait_for(a.step(started), timeout=5)
        finally:
            leases.stalled.set()  # lets the request's thread end
        return time.monotonic() - started

    took = asyncio.run(scenario())
    assert events == ["a leads", "a follows"] and not a.leading
    assert took < a.election.renew_deadline + 1


def test_holding_the_lease_means_renewed_within_the_renew_deadline_by_now() -> None:
    """What a loop asks right before it acts: a renew may be hanging while the elector still leads."""
    leases, events = FakeLeases(), list[str]()
    a = elector(leases, events, "a")

    asyncio.run(a.step(100.0))
    assert a.holds(105.0) and not a.holds(105.5)


def test_release_frees_the_lease_for_an_immediate_takeover() -> None:
    leases, events = FakeLeases(), list[str]()
    a, b = elector(leases, events, "a"), elector(leases, events, "b")

    async def scenario() -> None:
        await a.step(0.0)
        await b.step(0.1)
        await a.release()
        await b.step(0.2)

    asyncio.run(scenario())
    assert events == ["a leads", "b leads"]


class RenewInFlight(FakeLeases):
    """A clean stop while a renew's request is on its way: the stop cancels the election task, not
    the request its thread sent, which lands between the release's read and its write."""

    def __init__(self) -> None:
        super().__init__()
        self.late_renews = 1

    def write_lease(self, body: Obj) -> bool:
        if body["spec"]["holderIdentity"] == "" and self.late_renews:
            self.late_renews -= 1
            super().write_lease(lease_body("psop", "ops", "a", 8, NOW, LeaseRecord.parse(self.stored)))
        return super().write_lease(body)


def test_release_frees_the_lease_even_when_a_renew_in_flight_lands_between_its_read_and_write() -> None:
    leases, events = RenewInFlight(), list[str]()
    a, b = elector(leases, events, "a"), elector(leases, events, "b")

    async def scenario() -> None:
        await a.step(0.0)
        await b.step(0.1)
        await a.release()  # its first write is refused (409): the Lease moved
        await b.step(0.2)

    asyncio.run(scenario())
    assert leases.late_renews == 0 and events == ["a leads", "b leads"]

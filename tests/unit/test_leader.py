"""Leader election: who may hold the Lease, when it has expired by this replica's own clock, how an
elector takes it and loses it (against a fake of the two Lease calls and a fake clock), and that
nothing is written once it may be lost."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from psoperator.control.leader import Election, Elector, LeaseClock, LeaseRecord, lease_body, may_hold
from psoperator.kube import NotLeading, in_thread, lease_client
from psoperator.plan.children import ChildChange, ChildVerb
from psoperator.render import render_children
from tests.unit.builders import NOW, NS, job
from tests.unit.test_kube import RecordingKube

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


class Clock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeLeases:
    """The two Lease calls of Kube: one stored Lease, optimistic concurrency, an outage switch, and
    `reading`: what happens while the next GET is on its way (then it answers)."""

    def __init__(self) -> None:
        self.stored: Obj | None = None
        self.version = 0
        self.down = False
        self.reading: Callable[[], None] | None = None

    def get_lease(self, namespace: str, name: str) -> Obj | None:
        reading, self.reading = self.reading, None
        if reading is not None:
            reading()
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


def elector(
    leases: FakeLeases, events: list[str], name: str, clock: Callable[[], float], duration: int = 8
) -> Elector:
    made = Elector(
        leases,  # type: ignore[arg-type]
        Election("ops", "psop", duration),
        lead=lambda: events.append(f"{name} leads"),
        lost=lambda: events.append(f"{name} lost"),
        clock=clock,
    )
    made.me = name
    return made


def test_one_leads_the_other_takes_over_once_the_lease_expired_and_the_first_loses_it() -> None:
    leases, events, clock = FakeLeases(), list[str](), Clock()
    a, b = elector(leases, events, "a", clock), elector(leases, events, "b", clock)
    for now, who in ((0.0, a), (0.5, b), (8.0, b), (8.6, b), (9.0, a)):
        clock.now = now
        who.step()  # at 8.0 not expired yet by b's clock; at 8.6 it is: a stopped renewing (killed)
    assert events == ["a leads", "b leads", "a lost"]  # a, back at 9.0, has lost it (and exits)
    assert leases.stored is not None and leases.stored["spec"]["holderIdentity"] == "b"


@pytest.mark.parametrize(("outage", "still_leading"), [(5.0, True), (5.5, False)])
def test_a_leader_that_cannot_renew_loses_the_lease_at_its_renew_deadline(
    outage: float, still_leading: bool
) -> None:
    """The renew deadline (2/3 of 8 s) is shorter than the Lease: it stops before anyone may take over."""
    leases, events, clock = FakeLeases(), list[str](), Clock()
    a = elector(leases, events, "a", clock)
    a.step()
    leases.down, clock.now = True, outage
    a.step()
    assert a.leading is still_leading
    assert events == ["a leads"] + ([] if still_leading else ["a lost"])


@pytest.mark.parametrize(("answers", "after"), [(True, ["a leads"]), (False, ["a leads", "a lost"])])
def test_a_renew_that_hangs_stops_the_writes_at_the_renew_deadline(answers: bool, after: list[str]) -> None:
    """A half-open connection: the Lease GET answers only after its timeout. The replica writes
    nothing from its renew deadline on, while the request still hangs. When it answers, a renew that
    still goes through (nobody wrote the Lease meanwhile) lets it write again; one that fails has
    lost the Lease."""
    leases, events, clock = FakeLeases(), list[str](), Clock()
    a = elector(leases, events, "a", clock)
    a.step()
    during: list[bool] = []

    def hangs() -> None:
        for clock.now in (2.0, 5.0, 5.4, 7.0):
            during.append(a.holds())
        leases.down = not answers

    leases.reading, clock.now = hangs, 2.0
    a.step()
    assert during == [True, True, False, False] and events == after
    assert a.holds() is answers


def test_a_lease_taken_after_a_slow_read_is_held_from_the_write() -> None:
    """An API server just back (its caches warming): the standby's read takes 3 s, longer than a
    4 s Lease's renew deadline (2.7 s). It counts the Lease from when it sent its write, the earliest
    any other replica can see it: it may write at once, and its next renew keeps the Lease."""
    leases, events, clock = FakeLeases(), list[str](), Clock()
    b = elector(leases, events, "b", clock, duration=4)

    def slow_read() -> None:
        clock.now = 3.0

    leases.reading = slow_read
    b.step()
    assert b.holds()
    clock.now = 3.5
    b.step()
    assert events == ["b leads"] and b.holds()


def test_holding_the_lease_means_renewed_within_the_renew_deadline_by_now() -> None:
    leases, events, clock = FakeLeases(), list[str](), Clock(100.0)
    a = elector(leases, events, "a", clock)
    a.step()
    clock.now = 105.0
    assert a.holds()
    clock.now = 105.5
    assert not a.holds()


def test_a_standby_counts_the_lease_from_when_its_read_returned_so_a_slow_read_gives_no_overlap() -> None:
    """b's read is sent at 1 s and returns at 4.1 s with a's renew of 4 s. Counted from 1 s (when it
    was sent), the Lease would expire for b at 9 s while a may write until 9.3 s (4 s + its renew
    deadline): both would act. Counted from 4.1 s, b takes over at 12.1 s, once a may not."""
    leases, events, clock = FakeLeases(), list[str](), Clock()
    a, b = elector(leases, events, "a", clock), elector(leases, events, "b", clock)
    a.step()

    def slow_read() -> None:
        clock.now = 4.0
        a.step()  # a renews while b's read is on its way, and is then killed
        clock.now = 4.1

    leases.reading, clock.now = slow_read, 1.0
    b.step()
    for clock.now in (9.2, 12.0, 12.2):
        b.step()
        assert not (b.leading and a.holds()), f"both may write at {clock.now}s"
    assert events == ["a leads", "b leads"]


def _saturated(threads: int, release: threading.Event) -> list[asyncio.Future[Any]]:
    """Every thread of the event loop's default executor (the reconciles' API calls) busy."""
    return [asyncio.ensure_future(in_thread(release.wait, 30)) for _ in range(threads)]


def test_the_renew_runs_on_its_own_thread_whatever_the_reconciles_keep_busy() -> None:
    """A slow API server keeps every thread of the reconciles busy: the Lease is still taken (and
    then renewed) on the election's own thread; a clean stop frees it for the next replica."""
    leases, events = FakeLeases(), list[str]()
    a = elector(leases, events, "a", time.monotonic)

    async def scenario() -> float:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2))
        release = threading.Event()
        busy = _saturated(2, release)
        started = time.monotonic()
        a.start()
        while not events and time.monotonic() - started < 5:
            await asyncio.sleep(0.01)
        took = time.monotonic() - started
        await a.stop()
        release.set()
        await asyncio.gather(*busy)
        return took

    took = asyncio.run(scenario())
    assert events == ["a leads"] and took < 1.0
    assert leases.stored is not None and leases.stored["spec"]["holderIdentity"] == ""


def test_a_clean_stop_frees_the_lease_for_an_immediate_takeover_and_writes_nothing_more() -> None:
    leases, events, clock = FakeLeases(), list[str](), Clock()
    a, b = elector(leases, events, "a", clock), elector(leases, events, "b", clock)
    a.start()
    while not events:
        time.sleep(0.01)
    clock.now = 0.1
    b.step()
    asyncio.run(a.stop())
    assert not a.holds()
    clock.now = 0.2
    b.step()
    assert events == ["a leads", "b leads"]


def test_a_reconcile_thread_that_outlives_the_lease_sends_nothing_more_of_its_plan() -> None:
    """A reconcile cancelled when the Lease was lost (or a renew that hangs past the deadline)
    leaves its thread sending the plan's writes one by one: each is asked of the elector before it is
    sent, and from the renew deadline on none is."""
    leases, events, clock = FakeLeases(), list[str](), Clock()
    a = elector(leases, events, "a", clock)
    a.step()
    kube = RecordingKube(may_write=a.holds)
    children = [ChildChange(m, ChildVerb.CREATE) for m in render_children(job(), None)[:4]]
    sent = kube.wire.request

    def request(*args: Any, **kwargs: Any) -> Any:
        clock.now += 2.0  # each write answers 2 s later: the renew deadline (5.3 s) passes at the third
        return sent(*args, **kwargs)

    kube.wire.request = request  # type: ignore[method-assign]
    with pytest.raises(NotLeading):
        kube.make_changes(NS, children, [])
    assert [method for method, _ in kube.calls] == ["POST"] * 3


def test_the_election_has_a_client_of_its_own() -> None:
    """Its own connection (the reconciles' 32 cannot hold a renew up), no retry within a request
    (the next step is the retry), and no request outlasting the renew deadline."""
    election = Election("ops", "psop", 8)
    client = lease_client(election.request_timeout)
    pool = client.api.rest_client.pool_manager
    assert pool.connection_pool_kw["maxsize"] == 1 and pool.connection_pool_kw["retries"].total is False
    assert client.api is not RecordingKube().api and client.timeout <= election.renew_deadline

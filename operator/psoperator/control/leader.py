"""Leader election on a coordination.k8s.io Lease, as controller-runtime operators do: of the
replicas that run, only the Lease's holder reconciles jobs.

The holder renews the Lease every `retry` seconds; the others take it over only once it has not
changed for `duration` seconds by their own clock, counted from when their read that saw it change
returned (not from the renewTime written by another machine's clock, which may be skewed, nor from
when the read was sent: a slow read would start the count early). So the holder may write for
`renew_deadline` seconds (shorter than `duration`) from when it sent its last renew, and no longer:
kube.py asks `holds` before each write, so a reconcile's thread that outlived the Lease sends
nothing more of its plan. A holder that then fails to renew, or finds another holding the Lease,
has lost it: the process exits, as a controller-runtime manager does, to come back as a standby.
Status writes also carry the resourceVersion they were computed from, so a write computed from a
stale read is refused (409).

The election runs on a thread of its own with a client of its own (kube.lease_client: its own
connection, no retry within a request, each request bounded by the renew deadline): a busy event
loop, the reconciles' threads and their connections cannot hold a renew up.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psoperator.kube import Kube

Obj = dict[str, Any]
log = logging.getLogger(__name__)
# The exit status of a replica that lost the Lease: its container is restarted, and stands by.
EXIT_LEASE_LOST = 1


def identity() -> str:
    """This replica's holder identity: the pod's name (its hostname), the pid, a nonce."""
    return f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class LeaseRecord:
    holder: str | None
    renew_time: str | None
    acquire_time: str | None
    duration: int | None
    transitions: int
    resource_version: str | None

    @classmethod
    def parse(cls, lease: Obj | None) -> LeaseRecord | None:
        if not isinstance(lease, dict):
            return None
        spec, meta = lease.get("spec") or {}, lease.get("metadata") or {}
        duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
        return cls(
            holder=str(spec["holderIdentity"]) if spec.get("holderIdentity") else None,
            renew_time=spec.get("renewTime"),
            acquire_time=spec.get("acquireTime"),
            duration=duration if isinstance(duration, int) else None,
            transitions=transitions if isinstance(transitions, int) else 0,
            resource_version=meta.get("resourceVersion"),
        )


@dataclass
class LeaseClock:
    """When this replica last saw the Lease change, by its own monotonic clock."""

    seen: tuple[str | None, str | None] | None = None
    since: float = 0.0

    def observe(self, record: LeaseRecord | None, now: float) -> None:
        key = (record.holder, record.renew_time) if record else None
        if key != self.seen:
            self.seen, self.since = key, now

    def expired(self, record: LeaseRecord, default_duration: float, now: float) -> bool:
        return now - self.since > (record.duration or default_duration)


def may_hold(record: LeaseRecord | None, me: str, clock: LeaseClock, duration: float, now: float) -> bool:
    """Whether this replica may write itself into the Lease: it is free, ours, or expired."""
    return record is None or record.holder in (None, me) or clock.expired(record, duration, now)


def lease_body(
    name: str, namespace: str, me: str, duration: int, now: datetime, previous: LeaseRecord | None
) -> Obj:
    """The Lease held by `me` (released: ""), renewed now; a change of holder counts a transition."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    taken = previous is None or previous.holder != me
    transitions = 0 if previous is None else previous.transitions + (1 if taken and previous.holder else 0)
    acquired = previous.acquire_time if previous is not None and not taken else stamp
    spec = {
        "holderIdentity": me,
        "leaseDurationSeconds": duration,
        "acquireTime": acquired,
        "renewTime": stamp,
        "leaseTransitions": transitions,
    }
    metadata: Obj = {"name": name, "namespace": namespace}
    if previous is not None and previous.resource_version:
        metadata["resourceVersion"] = previous.resource_version  # optimistic concurrency: 409 if it moved
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


@dataclass(frozen=True)
class Election:
    """Where the Lease is and how long it lasts (psoperator run --leader-election NAME)."""

    namespace: str
    name: str
    duration: int = 8

    @property
    def retry(self) -> float:
        """How long after each step the next one comes: client-go's defaults' ratio (a 15 s Lease, a
        2 s retry), so that a renew deadline holds several tries, and a few slow steps in a row
        (a busy machine) do not lose the Lease."""
        return max(self.duration * 2 / 15, 0.5)

    @property
    def renew_deadline(self) -> float:
        return self.duration * 2 / 3

    @property
    def request_timeout(self) -> float:
        """The longest one Lease request may take: the renew deadline. A renew that ends later has
        lost the Lease, and `holds` stops the writes at the deadline whether its requests answer or
        not; a shorter bound would only fail renews that still had the time to succeed."""
        return self.renew_deadline


def exit_process() -> None:
    """What a replica that lost the Lease does: it exits at once, with no clean-up that could write."""
    logging.shutdown()  # the last lines reach the log first
    os._exit(EXIT_LEASE_LOST)


class Elector:
    """Competes for the Lease on a thread of its own (`start`): `lead` is called (on that thread)
    when this replica starts holding it, `lost` when it loses it (by default the process exits)."""

    def __init__(
        self,
        kube: Kube,
        election: Election,
        lead: Callable[[], object],
        lost: Callable[[], None] = exit_process,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.election, self.lead, self.lost, self.clock = kube, election, lead, lost, clock
        self.me = identity()
        self.seen = LeaseClock()
        self.leading = False
        # Until when (by `clock`) this replica may write: its last renew's sending and the renew deadline.
        self.until = -math.inf
        self.failing = False
        self._lock = threading.Lock()  # `until` and `leading` change under it, from either thread
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._ended: concurrent.futures.Future[None] = concurrent.futures.Future()

    def start(self) -> None:
        log.info(
            "leader election: %s competes for Lease %s/%s",
            self.me,
            self.election.namespace,
            self.election.name,
        )
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self.step()
                self._stopping.wait(self.election.retry)
            self._release()
        finally:
            self._ended.set_result(None)

    def step(self) -> None:
        """Read the Lease and renew or take it if this replica may. A leader that finds another
        holding it, or fails to renew it once its renew deadline has passed, has lost it."""
        e = self.election
        try:
            written, taken = self._try_hold()
            self._told_recovered()
        except Exception as error:  # unreachable, refused or no answer in time: tried again next period
            self._tell_failing(error)
            written, taken = None, False
        with self._lock:
            if self._stopping.is_set():
                return
            if written is not None:
                self.until = written + e.renew_deadline
            elif self.leading and (taken or not self.holds()):
                why = "another replica holds it" if taken else f"not renewed within {e.renew_deadline:.1f}s"
                self._lose(why)
                return
            if written is None or self.leading:
                return
            self.leading = True
        log.warning("leader election: %s leads", self.me)
        self.lead()

    def _try_hold(self) -> tuple[float | None, bool]:
        """Write this replica into the Lease if it may: when the write that did so was sent (None:
        none did), and whether another holds the Lease. Any other replica counts the Lease from
        when its read of this write returned, so never before then: writes are safe until that
        moment plus the renew deadline (the duration being longer)."""
        e = self.election
        record = LeaseRecord.parse(self.kube.get_lease(e.namespace, e.name))
        now = self.clock()  # after the read: it saw the Lease as it is now, not when it was sent
        self.seen.observe(record, now)
        if not may_hold(record, self.me, self.seen, e.duration, now):
            return None, record is not None and record.holder not in (None, self.me)
        sent = self.clock()
        body = lease_body(e.name, e.namespace, self.me, e.duration, datetime.now(UTC), record)
        return (sent if self.kube.write_lease(body) else None), False

    def holds(self) -> bool:
        """Whether this replica may write now: it renewed the Lease within the renew deadline. Asked
        before every write (kube.Kube.may_write), from any thread: a renew may hang meanwhile."""
        return self.clock() < self.until

    def _lose(self, why: str) -> None:
        self.leading, self.until = False, -math.inf
        self._stopping.set()
        log.error("leader election lost: %s; %s exits", why, self.me)
        self.lost()

    async def stop(self) -> None:
        """On a clean stop: no write of this replica's from now on; the renewing thread ends, freeing
        the Lease so that another replica takes over at once, and this returns once it did."""
        with self._lock:
            self.until = -math.inf
            self._stopping.set()
        if self._thread is not None:
            await asyncio.wrap_future(self._ended)

    def _release(self) -> None:
        """Free the Lease if this replica holds it: on the renewing thread, after its last renew."""
        if not self.leading:
            return
        e = self.election
        try:
            record = LeaseRecord.parse(self.kube.get_lease(e.namespace, e.name))
            if record is not None and record.holder == self.me:
                self.kube.write_lease(lease_body(e.name, e.namespace, "", 1, datetime.now(UTC), record))
        except Exception as error:  # the Lease then expires as if this replica had been killed
            log.warning("leader election: the Lease could not be freed: %s", error)

    def _tell_failing(self, error: object) -> None:
        if not self.failing:  # once per outage, not at every retry
            log.warning("leader election: the Lease cannot be read or written: %s", error)
        self.failing = True

    def _told_recovered(self) -> None:
        if self.failing:
            log.warning("leader election: the Lease can be read and written again")
        self.failing = False

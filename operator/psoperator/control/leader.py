"""Leader election on a coordination.k8s.io Lease, as controller-runtime operators do: of the
replicas that run, only the Lease's holder reconciles jobs.

The holder renews the Lease every `retry` seconds; the others take it over only once it has not
changed for `duration` seconds by their own clock (when they observed it change, not the renewTime
written by another machine's clock, which may be skewed). A holder that has not renewed for
`renew_deadline` seconds (shorter than `duration`) stops reconciling before anyone may take over,
so two replicas never reconcile at once while both can reach the API; status writes carry the
resourceVersion they were computed from, so even then a stale replica's write is refused (409).
A request that never answers (a half-open connection) ends at the renew deadline too: each step is
bounded by it, and a loop asks `holds` right before it acts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psoperator.kube import Kube, in_thread

Obj = dict[str, Any]
log = logging.getLogger(__name__)


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
        return max(self.duration / 4, 0.5)

    @property
    def renew_deadline(self) -> float:
        return self.duration * 2 / 3


# A release refused because the Lease changed: at most the one renew in flight, and a margin.
RELEASE_TRIES = 3


class Elector:
    """Holds the Lease while it can: `lead` runs when this replica starts holding it, `follow` when
    it stops (another holds it, or it could not renew within the renew deadline)."""

    def __init__(
        self,
        kube: Kube,
        election: Election,
        lead: Callable[[], Awaitable[None]],
        follow: Callable[[], Awaitable[None]],
    ) -> None:
        self.kube, self.election, self.lead, self.follow = kube, election, lead, follow
        self.me = identity()
        self.clock = LeaseClock()
        self.leading = False
        self.renewed = 0.0
        self.failing = False

    async def run(self) -> None:
        log.info(
            "leader election: %s competes for Lease %s/%s",
            self.me,
            self.election.namespace,
            self.election.name,
        )
        while True:
            await self.step(time.monotonic())
            await asyncio.sleep(self.election.retry)

    async def step(self, now: float) -> None:
        e = self.election
        # Bounded as client-go bounds a renew by its RenewDeadline: a request that never answers
        # (each GET may wait 30 s, and is retried) must not keep this replica leading after the
        # standby may take over. A leader has what is left of its deadline since its last renew.
        budget = e.renew_deadline - (now - self.renewed) if self.leading else e.renew_deadline
        try:
            async with asyncio.timeout(max(budget, 0.0)):
                held, lost = await self._try_hold(now)
            self._told_recovered()
        except TimeoutError:  # a lost renew: by the time it answers, the Lease may be another's
            self._tell_failing(f"no answer within the renew deadline ({e.renew_deadline:.1f}s)")
            held, lost = False, True
        except Exception as error:  # the API is unreachable or refuses: keep leading until the deadline
            self._tell_failing(error)
            held, lost = False, False
        if held:
            self.renewed = now
        within_deadline = self.leading and now - self.renewed < e.renew_deadline
        await self._become(held or (within_deadline and not lost))

    async def _try_hold(self, now: float) -> tuple[bool, bool]:
        """Write this replica into the Lease if it may: (held, whether another holds it)."""
        e = self.election
        record = LeaseRecord.parse(await in_thread(self.kube.get_lease, e.namespace, e.name))
        self.clock.observe(record, now)
        held = may_hold(record, self.me, self.clock, e.duration, now) and await in_thread(
            self.kube.write_lease,
            lease_body(e.name, e.namespace, self.me, e.duration, datetime.now(UTC), record),
        )
        return held, not held and record is not None and record.holder not in (None, self.me)

    def holds(self, now: float) -> bool:
        """Whether this replica leads and renewed within the renew deadline by `now`: asked right
        before a loop acts, since a renew that hangs ends only at the deadline."""
        return self.leading and now - self.renewed < self.election.renew_deadline

    async def _become(self, leading: bool) -> None:
        if leading == self.leading:
            return
        self.leading = leading
        log.warning("leader election: %s %s", self.me, "leads" if leading else "follows")
        await (self.lead() if leading else self.follow())

    async def release(self) -> None:
        """On a clean stop: free the Lease, so that another replica takes over at once. A renew of
        this replica's own may land between the read and the write (the stop cancelled the election
        task, not the request its thread had sent): the refused write is tried again."""
        if not self.leading:
            return
        e = self.election
        for _ in range(RELEASE_TRIES):
            record = LeaseRecord.parse(await in_thread(self.kube.get_lease, e.namespace, e.name))
            if record is None or record.holder != self.me:
                return
            body = lease_body(e.name, e.namespace, "", 1, datetime.now(UTC), record)
            if await in_thread(self.kube.write_lease, body):
                return

    def _tell_failing(self, error: object) -> None:
        if not self.failing:  # once per outage, not at every retry
            log.warning("leader election: the Lease cannot be read or written: %s", error)
        self.failing = True

    def _told_recovered(self) -> None:
        if self.failing:
            log.warning("leader election: the Lease can be read and written again")
        self.failing = False

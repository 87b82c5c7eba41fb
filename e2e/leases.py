"""Two operator replicas with leader election, as the e2e tests run them, and their Lease as the tests
read it: who holds it (holder identity `<hostname>_<pid>_<nonce>`, psoperator.control.leader.identity) and
how it changed hands."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.accounts import CHART_NAMESPACE
from e2e.operator_process import OperatorProcess
from e2e.util import as_json
from psoperator.control.leader import LeaseRecord
from psoperator.timeutil import parse_time


def read(k8s: client.ApiClient, lease: str) -> LeaseRecord | None:
    try:
        found = client.CoordinationV1Api(k8s).read_namespaced_lease(lease, CHART_NAMESPACE)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return LeaseRecord.parse(as_json(k8s, found))


def holder(k8s: client.ApiClient, lease: str) -> str | None:
    record = read(k8s, lease)
    return record.holder if record else None


def pid(holder: str | None) -> int | None:
    """The pid in a holder identity."""
    return int(holder.split("_")[-2]) if holder else None


def holder_pid(k8s: client.ApiClient, lease: str) -> int | None:
    return pid(holder(k8s, lease))


@contextlib.contextmanager
def replicas(
    k8s: client.ApiClient,
    kubeconfig: Path,
    namespace: str,
    logs: Path,
    lease_seconds: int,
    extra_args: tuple[str, ...] = (),
) -> Iterator[tuple[list[OperatorProcess], str]]:
    """Two operators (logs `a.log`, `b.log` in `logs`) competing for a Lease of their own, started;
    afterwards both stopped and the Lease deleted."""
    lease = f"psop-e2e-{uuid.uuid4().hex[:8]}"
    args = [
        "--leader-election", lease,
        "--lease-seconds", str(lease_seconds),
        "--operator-namespace", CHART_NAMESPACE,
        *extra_args,
    ]  # fmt: skip
    both = [OperatorProcess(kubeconfig, namespace, logs / f"{n}.log", args) for n in "ab"]
    try:
        for replica in both:
            replica.start()
        yield both, lease
    finally:
        for replica in both:
            replica.stop()
        _delete(k8s, lease)


def _delete(k8s: client.ApiClient, lease: str) -> None:
    try:
        client.CoordinationV1Api(k8s).delete_namespaced_lease(lease, CHART_NAMESPACE)
    except ApiException as error:
        if error.status != 404:  # never made: no replica got as far
            raise


@dataclass
class Handovers:
    """The Lease's holders in the order they held it, from records read now and then, and the
    longest handover: the new holder's acquireTime after the last renewal seen of the one before
    (no replica led for about that long, give or take one renewal period)."""

    holders: list[str] = field(default_factory=list)
    longest: float = 0.0
    _last_renewal: str | None = None

    def observe(self, record: LeaseRecord | None) -> None:
        if record is None or not record.holder:  # not made yet, or freed by a clean stop
            return
        if not self.holders or record.holder != self.holders[-1]:
            if self.holders:
                self.longest = max(self.longest, _seconds_between(self._last_renewal, record.acquire_time))
            self.holders.append(record.holder)
        self._last_renewal = record.renew_time


def _seconds_between(earlier: str | None, later: str | None) -> float:
    start, end = parse_time(earlier), parse_time(later)
    return (end - start).total_seconds() if start and end else 0.0

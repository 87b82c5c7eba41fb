"""The chaos run's reading of the replicas' Lease (e2e/leases.py): holders in order, the longest
handover, the pid in a holder identity."""

from __future__ import annotations

from e2e.leases import Handovers, pid
from psoperator.control.leader import LeaseRecord


def _record(holder: str, renewed: str, acquired: str) -> LeaseRecord:
    day = "2026-01-01T00:00:"
    return LeaseRecord(holder, day + renewed + "+00:00", day + acquired + "+00:00", 4, 0, "1")


def test_a_handover_lasts_from_the_last_renewal_seen_to_the_new_holders_acquire_time() -> None:
    handovers = Handovers()
    for record in (
        None,  # not made yet
        _record("host_10_a", "01.0", "00.0"),
        _record("host_10_a", "02.5", "00.0"),
        _record("host_11_b", "07.5", "07.0"),  # killed after 02.5: 4.5 s without a leader
        _record("", "08.0", "08.0"),  # freed by a clean stop
        _record("host_12_c", "09.0", "08.5"),
    ):
        handovers.observe(record)
    assert handovers.holders == ["host_10_a", "host_11_b", "host_12_c"]
    assert handovers.longest == 4.5


def test_the_pid_is_the_second_last_part_of_a_holder_identity() -> None:
    assert pid("op-7d9f_4242_1a2b3c") == 4242
    assert pid("my_host_7_abcdef") == 7
    assert pid(None) is None

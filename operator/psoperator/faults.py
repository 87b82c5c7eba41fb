"""Fault points for tests: the operator crashes where a test says, so a crash window is exercised
for real instead of being imitated by writing the state a crash would leave.

Off in production: nothing happens unless the PSOPERATOR_FAULT environment variable names a fault
(comma-separated); the chart never sets it. A name this version does not know stops the operator at
start, so a misspelt fault cannot let a test pass without its crash.
"""

from __future__ import annotations

import enum
import os

FAULT_ENV = "PSOPERATOR_FAULT"
# The exit code of a fault: what a SIGKILL gives, so nothing mistakes it for a clean exit.
FAULT_EXIT_CODE = 137


class Fault(enum.StrEnum):
    # Right after the status write that records a restart, before the new chief Job exists: the
    # restart counter says attempt N+1 and only attempt N's chief is there.
    EXIT_AFTER_RESTART_STATUS_WRITE = "exit-after-restart-status-write"


def parse_faults(value: str | None) -> frozenset[Fault]:
    names = [n.strip() for n in (value or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in Fault._value2member_map_]
    if unknown:
        known = ", ".join(Fault)
        raise ValueError(f"{FAULT_ENV}: unknown fault {', '.join(unknown)} (known: {known})")
    return frozenset(Fault(n) for n in names)


def faults_from_environment() -> frozenset[Fault]:
    return parse_faults(os.environ.get(FAULT_ENV))


def crash_at(fault: Fault, active: frozenset[Fault]) -> None:
    """Exit at once, as a killed process would: no clean-up, no finally blocks."""
    if fault in active:
        os._exit(FAULT_EXIT_CODE)

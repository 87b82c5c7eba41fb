"""The words of a PSTrainingJob's status, defined once: phases and condition types.

The API models, the reconcile stages, the TTL policy, the metrics and the order of conditions all
read these, so a new phase or condition is added in one place.
"""

from __future__ import annotations

import enum


class Phase(enum.StrEnum):
    PENDING = "Pending"
    CREATING = "Creating"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"  # waiting for Kueue to admit it (queueing.py)


# After these nothing is decided any more: only clean-up and the TTL.
FINISHED_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class ConditionType(enum.StrEnum):
    """In the order conditions are listed in status, so status is stable across reconciles."""

    CREATED = "Created"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    QUEUED = "Queued"
    RESIZED = "Resized"
    STALLED = "Stalled"
    UNSCHEDULABLE = "Unschedulable"
    NETWORK_POLICY_MISSING = "NetworkPolicyMissing"
    TEMPLATE_OVERRIDDEN = "TemplateOverridden"
    NODE_LOST = "NodeLost"
    SIZING_WARNING = "SizingWarning"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

"""Kubernetes-style conditions: set one, keeping lastTransitionTime unless its status changes."""

from __future__ import annotations

from psoperator.api.models import Condition
from psoperator.api.vocabulary import ConditionType

# The order conditions are listed in, so status is stable across reconciles.
ORDER: tuple[str, ...] = tuple(ConditionType)


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: str,
    generation: int | None,
) -> list[Condition]:
    value = "True" if status else "False"
    old = next((c for c in conditions if c.type == type_), None)
    changed = old is None or old.status != value
    new = Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=now if changed or old is None else old.last_transition_time,
        observed_generation=generation,
    )
    rest = [c for c in conditions if c.type != type_]
    rank = {t: i for i, t in enumerate(ORDER)}
    return sorted([*rest, new], key=lambda c: (rank.get(c.type, len(ORDER)), c.type))


def is_true(conditions: list[Condition], type_: str) -> bool:
    return any(c.type == type_ and c.status == "True" for c in conditions)

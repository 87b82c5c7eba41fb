"""Fields of an API object read as the type the operator expects, or as unknown: what makes parsing
the observed objects (observe/) and the records of its own status (api/models.py) forgiving."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

# The largest count, index or exit code read: the job's status keeps them as 64-bit integers.
INT_LIMIT = 2**63
INT_DIGITS = len(str(INT_LIMIT))


def dict_of(value: Any) -> Obj:
    return value if isinstance(value, dict) else {}


def list_of(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def str_of(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def int_of(value: Any) -> int | None:
    """A count, an index or an exit code, as a number or a label's decimal digits: a non-negative
    integer of 64 bits, else unknown. (isdecimal, not isdigit: int() refuses a superscript digit; and
    it refuses more than 4,300 digits.)"""
    if isinstance(value, str) and value.isdecimal() and len(value) <= INT_DIGITS:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 <= value < INT_LIMIT else None

"""The status write: a merge patch from the status the reconcile read to the one it computed."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def merge_patch(old: Any, new: Any) -> Any:
    """An RFC 7386 merge patch that turns `old` into `new` (None where a key went away)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: Obj = {k: None for k in old if k not in new}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = merge_patch(old[key], value)
    return patch

"""A checkpoint request as the chief's trainer parses it (pstrainer.ondemand.parse_request): the
query string and the body of POST /checkpoint.

Promised: a request within the contract's bounds, or ValueError (answered 400 with its message);
never another exception, which would leave the asker without an answer.
"""

from __future__ import annotations

import math

from psoperator.contract import MAX_CHECKPOINT_REQUEST_SECONDS
from pstrainer.ondemand import parse_request


def TestOneInput(data: bytes) -> None:
    line, _, body = data.partition(b"\n")  # the query string, then the body
    query = line.decode(errors="replace")
    try:
        request = parse_request(query, body)
    except ValueError as error:
        assert str(error)
        return
    assert 0 < request.deadline_seconds <= MAX_CHECKPOINT_REQUEST_SECONDS
    assert 0 <= request.hold_seconds <= MAX_CHECKPOINT_REQUEST_SECONDS
    assert math.isfinite(request.deadline_seconds) and math.isfinite(request.hold_seconds)

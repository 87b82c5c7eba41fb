"""The chiefs' tokens, derived from the operator's key and the job's uid (control/chief_key.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from psoperator.control.chief_key import ChiefKey

KEY = b"k" * 32


def test_a_jobs_token_is_the_same_from_every_replica_and_tells_nothing_of_another_jobs() -> None:
    token = ChiefKey(KEY).token("uid-a")
    assert token == ChiefKey(KEY).token("uid-a")  # another replica, the same key
    assert len(token) == 64 and int(token, 16) >= 0
    assert ChiefKey(KEY).token("uid-b") != token
    assert ChiefKey(b"j" * 32).token("uid-a") != token  # another key


def test_the_key_is_read_from_its_file_byte_for_byte(tmp_path: Path) -> None:
    """Random bytes (`head -c 32 /dev/urandom`) may begin or end with a newline or a space."""
    key = b"\n" + b"k" * 30 + b" "
    path = tmp_path / "key"
    path.write_bytes(key)
    assert ChiefKey.from_file(str(path)).token("u") == ChiefKey(key).token("u")


def test_the_key_shows_in_no_repr() -> None:
    key = ChiefKey(KEY)
    assert "k" * 8 not in repr(key) and key.token("u") not in repr(key)


def test_a_short_key_is_refused() -> None:
    with pytest.raises(ValueError, match="31 bytes; at least 32"):
        ChiefKey(b"k" * 31)

"""The operator's key to its chiefs: each job's chief token is derived from it and the job's uid.

The chief's progress port answers only a request carrying its job's token (the contract's
ENV_CHIEF_TOKEN_FILE). The operator never reads a token back: it derives each job's as an HMAC of
the job's uid under its one key, creates the job's Secret holding it (create only: the operator has
no right to read Secrets), and sends it with every request. Replicas sharing the key derive the same
tokens; one job's token tells nothing of another's.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

# Enough that the key cannot be guessed: the chart makes one of 64 random letters and digits.
MIN_KEY_BYTES = 32
_PURPOSE = b"psoperator.io/chief-token/v1:"


class ChiefKey:
    """The key; its repr shows nothing of it, so that no log or traceback does."""

    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the chief key has {len(key)} bytes; at least {MIN_KEY_BYTES} are needed")
        self._key = key

    @classmethod
    def from_file(cls, path: str) -> ChiefKey:
        """The key in a file, every byte of it (a random key may begin or end with a byte that looks
        like whitespace); ValueError saying what is wrong."""
        try:
            return cls(Path(path).read_bytes())
        except OSError as error:
            raise ValueError(f"cannot read the chief key from {path}: {error.strerror or error}") from None
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from None

    def token(self, job_uid: str) -> str:
        """The token of the job with this uid: 64 hexadecimal digits."""
        return hmac.new(self._key, _PURPOSE + job_uid.encode(), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return "ChiefKey(<hidden>)"

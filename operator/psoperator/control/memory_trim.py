"""The C heap's free pages given back to the system, now and then.

Every JSON body the API client reads, and every Python object over 512 bytes, comes from glibc's
malloc. After a busy moment (a start on 1,000 jobs lists every job, child and pod at once) most of
that is freed, but glibc gives back only the free memory at the very top of each heap: the rest
stays in the process's memory, and in the pod's, for good. `malloc_trim(0)` gives back every whole
free page. Where the C library is not glibc (no `malloc_trim`), nothing is done.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

# How often: a trim walks the heap's free chunks, in a thread.
TRIM_SECONDS = 60.0


def malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the process's C library has none."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


async def trim_every(seconds: float = TRIM_SECONDS) -> None:
    """Trim the heap every `seconds`, until cancelled."""
    trim = malloc_trim()
    if trim is None:
        log.info("the C library has no malloc_trim: the heap's free pages stay with the process")
        return
    while True:
        await asyncio.sleep(seconds)
        await asyncio.to_thread(trim, 0)  # ctypes lets go of the GIL for the call

"""The C heap's free pages given back (control/memory_trim.py)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os

import pytest

from psoperator.control import memory_trim

BLOCK = 8192  # over glibc's 128 KiB mmap threshold it would not be the heap's
BLOCKS = 20_000  # 160 MiB


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_a_trim_gives_back_the_free_pages_glibc_keeps_inside_its_heap() -> None:
    """Freed blocks with a live one above them stay in the process (glibc gives back only the top
    of a heap), however long it waits; malloc_trim returns them."""
    trim = memory_trim.malloc_trim()
    assert trim is not None, "glibc has malloc_trim"
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(BLOCK) for _ in range(BLOCKS)]
    for block in blocks:
        ctypes.memset(block, 1, BLOCK)
    kept = set(blocks[::64])
    before = _rss_mib()
    for block in blocks:
        if block not in kept:
            libc.free(block)
    freed = _rss_mib()
    trim(0)
    trimmed = _rss_mib()
    for block in kept:
        libc.free(block)
    assert before - freed < 20, (before, freed)
    assert freed - trimmed > 100, (before, freed, trimmed)


def test_the_heap_is_trimmed_every_period_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(memory_trim, "malloc_trim", lambda: calls.append)

    async def run() -> None:
        task = asyncio.create_task(memory_trim.trim_every(0.01))
        await asyncio.sleep(0.2)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert len(calls) >= 3 and set(calls) == {0}


def test_without_malloc_trim_nothing_is_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_trim, "malloc_trim", lambda: None)
    asyncio.run(asyncio.wait_for(memory_trim.trim_every(0.01), timeout=1))

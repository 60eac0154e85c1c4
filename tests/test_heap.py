"""`agentgym_opd.heap`: freed heap memory goes back to the OS once the resident size has grown (glibc, Linux)."""

from __future__ import annotations

import sys

import pytest

from agentgym_opd.heap import resident_bytes, trim_heap, trim_if_grown


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim and /proc are Linux's")
def test_freed_heap_blocks_go_back_to_the_os_and_only_after_growth():
    blocks = [bytearray(10_000) for _ in range(30_000)]  # 300 MB of heap blocks (below the mmap threshold)
    for block in blocks:
        block[::4096] = b"x" * len(block[::4096])  # touch every page
    keep = blocks[-1]  # the last block pins the heap's top, so only trimming inside the heap can free pages
    del blocks
    before = resident_bytes()
    trim_heap()
    after = resident_bytes()
    assert before is not None and after is not None and before - after > 100_000_000
    assert trim_if_grown(step=0)  # grown by more than nothing since the last trim
    assert not trim_if_grown(step=1 << 40)  # not by a terabyte
    assert keep[0] == ord("x")

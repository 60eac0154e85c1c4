"""``--threads N``: torch's CPU threads for one command's process.

Torch starts one thread per core. On a machine other jobs share that is the slow choice: the threads of one
operation wait for each other (OpenMP spins at each barrier), so a thread the scheduler has parked stalls the
rest. Measured on the 2-core build machine beside two busy processes: a SmolLM2 `eval` of 6 household games
took 227 s on torch's 2 threads and 44 s on 1, with the same 344 tokens generated. The bench already runs
each worker on one thread (`bench --threads`)."""

from __future__ import annotations

import argparse

HELP = ("torch CPU threads for this process (default: torch's, one per core); on a machine other jobs share, 1 "
        "(threads wait for each other, and one the scheduler parks stalls the rest: 5x slower measured)")


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None, metavar="N", help=HELP)


def apply_threads(threads: int | None) -> None:
    """Set torch's CPU threads (None: leave torch's default); fewer than 1 is an error naming the fix."""
    if threads is None:
        return
    if threads < 1:
        raise ValueError(f"--threads needs at least 1 thread, got {threads}; leave it out for torch's default")
    import torch

    torch.set_num_threads(threads)

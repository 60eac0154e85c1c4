"""Metrics summed over ranks: ranks that report different keys raise on every rank instead of adding unrelated
numbers or deadlocking (two teachers on different paths once hung a DDP run this way)."""

from __future__ import annotations

import os
import socket

import pytest
import torch.multiprocessing as mp

from agentgym_opd import distributed as D


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    ctx = D.init_distributed(timeout_s=60)
    lines = []
    same = D.all_reduce_sum_metrics({"loss": 1.0 + rank, "kl": 2.0}, ctx)
    lines.append(f"same {same['loss']} {same['kl']}")
    mean = D.all_reduce_mean({"loss": 1.0 + rank}, ctx)
    lines.append(f"mean {mean['loss']}")
    extra = {"loss": 1.0, **({"cross/full_share": 0.5} if rank == 0 else {})}
    try:
        D.all_reduce_sum_metrics(extra, ctx)
        lines.append("mismatch summed")
    except ValueError as err:
        lines.append("mismatch raised: " + str(err).split(":")[0])
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(lines))
    D.teardown(ctx)


@pytest.mark.slow
def test_ranks_sum_matching_metrics_and_all_raise_on_different_keys(tmp_path):
    mp.spawn(_rank_main, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        lines = (tmp_path / f"rank{rank}.txt").read_text().splitlines()
        assert lines == ["same 3.0 4.0", "mean 1.5", "mismatch raised: ranks report different metric keys"], lines


def test_one_process_returns_its_own_metrics():
    ctx = D.DistContext()
    assert D.all_reduce_sum_metrics({"loss": 2, "kl": 0.5}, ctx) == {"loss": 2.0, "kl": 0.5}
    assert D.all_reduce_mean({"loss": 2}, ctx) == {"loss": 2.0}

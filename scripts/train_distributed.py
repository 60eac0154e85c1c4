"""Data-parallel training of any registered algorithm: the Trainer's update loop under torchrun, DDP or FSDP2.

    torchrun --nproc_per_node 2 scripts/train_distributed.py --strategy ddp \\
        --algo grpo --env household/train --student tiny \\
        train.steps=3 train.micro_batch_size=2 rollout.tasks_per_step=2 rollout.group_size=2 \\
        rollout.max_turns=2 rollout.max_new_tokens=8 output_dir=runs/ddp

(the same flags and ``section.key=value`` overrides as ``agentgym-opd train``; plain ``python`` runs it as
one process). What each rank does per step, and why:

1. draws the step's task list with the run's seeded RNG: the same list on every rank;
2. collects the rollouts of ITS contiguous share of those tasks (``shard_tasks``), seeded with the global
   row index of its first rollout, so the union over ranks is exactly the one-process batch;
3. ``distributed_update``: the algorithm's loss on its rows, weighted so the averaged gradient is the
   global batch's (exact for token means too), one optimiser step;
4. rank 0 appends the global metrics (rank means) to ``<output_dir>/metrics.jsonl``; at the end it saves
   the full model (gathered from the FSDP shards) to ``<output_dir>/final/``.

Under FSDP the sharded network cannot generate (every forward is a collective and ranks generate different
numbers of tokens), so rollouts use an unsharded copy, refreshed from the gathered weights after each
update. Evaluation and resuming are left to the Trainer integration (see agentgym_opd/distributed.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from agentgym_opd import distributed as D
from agentgym_opd.commands.train import add_arguments
from agentgym_opd.config import run_config_from_cli, save_config
from agentgym_opd.trainer import Trainer, algorithm_class, batch_metrics, load_policy


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", choices=D.STRATEGIES, default="ddp", help="how the student is wrapped")
    add_arguments(parser)
    return parser.parse_args(argv)


def env_args(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--env-arg expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = D.init_distributed()  # before the model loads: on CUDA it selects this rank's device
    try:
        algo_cls = algorithm_class(args.algo) if args.algo else None
        overrides = list(args.overrides) + ([f"output_dir={args.output_dir}"] if args.output_dir else [])
        config = run_config_from_cli(args.config, overrides, algorithm=args.algo, env=args.env,
                                     student=args.student, teacher=args.teacher,
                                     algo_config_cls=algo_cls.Config if algo_cls else None)
        trainer = Trainer(config, env_overrides=env_args(args.env_arg), progress=False)
        optimizer = trainer.algorithm.optimizer
        algorithm = D.distribute_algorithm(trainer.algorithm, args.strategy, ctx)
        if algorithm.optimizer is not optimizer:  # FSDP2 made new parameters: the LR schedule follows them
            trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(algorithm.optimizer, trainer.scheduler.lr_lambdas)
        rollout_copy = None
        if D.is_fsdp(algorithm.model):
            rollout_copy = load_policy(config.model.student, config, trainable=False)
            trainer.engine.policy = rollout_copy
        out_dir = Path(config.output_dir)
        if ctx.is_main:
            save_config(config, out_dir / "config.yaml")
            (out_dir / "metrics.jsonl").write_text("", encoding="utf-8")
        r, group = config.rollout, trainer.group_size
        for step in range(config.train.steps):
            tasks = [trainer.task_rng.choice(trainer.task_ids) for _ in range(r.tasks_per_step)]
            local_tasks, first_row = D.shard_tasks(tasks, ctx, group)
            seed = config.seed * 1_000_000_007 + step * r.tasks_per_step * group + first_row
            batch = algorithm.collect(trainer.engine, trainer.envs[: len(local_tasks) * group], local_tasks,
                                      group_size=group, seed=seed)
            metrics = D.distributed_update(algorithm, batch, ctx)
            trainer.scheduler.step()
            if rollout_copy is not None:
                rollout_copy.model.load_state_dict(D.full_state_dict(algorithm.model, ctx, rank0_only=False), strict=False)
            stats = D.all_reduce_mean(batch_metrics(batch), ctx)
            for count in ("agent_tokens", "tokens"):  # totals of the global batch, not per-rank means
                stats[count] *= ctx.world_size
            record = {"step": step + 1, "world_size": ctx.world_size, "strategy": args.strategy, **metrics,
                      **stats, "lr": trainer.scheduler.get_last_lr()[0]}
            if ctx.is_main:
                with open(out_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
                print(json.dumps({k: record[k] for k in ("step", "loss", "reward", "grad_norm") if k in record}),
                      flush=True)
        full = D.full_state_dict(algorithm.model, ctx)  # collective under FSDP: every rank calls it
        if ctx.is_main:
            saver = rollout_copy.model if rollout_copy is not None else D.unwrap_model(algorithm.model)
            if rollout_copy is not None:
                saver.load_state_dict(full, strict=False)
            saver.save_pretrained(out_dir / "final")
            trainer.student.tokenizer.save_pretrained(out_dir / "final")
    except BaseException:
        D.teardown(ctx, barrier=False)  # the other ranks may never reach a barrier
        raise
    D.teardown(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())

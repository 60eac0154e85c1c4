"""How far can perfect labels on the student's own states lift it? The ceiling of any teacher for OPD.

On-policy distillation teaches the student the teacher's action at the states the student reaches. A teacher
can only be as good as the best label there, and the household env has one: the observable expert resumes
from any state (`environments.household.expert.continuation`). This probe samples the student's rollouts
on train tasks (temperature 1, the bench's 20 turns), cuts each at random turns, and trains the student by
cross-entropy on the expert's action there (DAgger with a perfect teacher), then plays it greedily on the
first held-out tasks (the bench's seed-0 block). If even these labels do not lift the student, no teacher
will at this budget, and the student is what limits OPD. Two controls keep the update itself honest:

* ``--labels first``: only the expert's first action after the cut, the label at the student's own state;
* ``--labels continuation``: the expert's whole continuation from there (the later turns are its own states);
* ``--labels demonstration``: the expert's demonstrations of the same tasks (plain SFT, no student states).

    python scripts/probes/oracle_probe.py STUDENT_MODEL --rollouts 128 --cuts 4 --steps 32 --lr 3e-4 --labels first
"""

from __future__ import annotations

import argparse
import random
from typing import Any

LABELS = ("first", "continuation", "demonstration")


def oracle_examples(policy: Any, task_ids: list[str], *, labels: str, cuts: int, env_args: dict[str, Any],
                    seed: int = 0, max_turns: int = 40) -> list[tuple[list[int], list[int]]]:
    """(token ids, loss mask) rows: ``cuts`` per task of the student's own sampled rollout, with the expert's
    labels per ``labels`` (one row per task for ``demonstration``)."""
    from agentgym_opd.registry import make
    from evaluation.bench.base_data import after_student, sampled_turns, scripted_example
    from evaluation.bench.base_training import action_spans

    if labels not in LABELS:
        raise ValueError(f"labels must be one of {LABELS}, got {labels!r}")
    env = make("household/train", **env_args, max_turns=max_turns)
    scratch = make("household/train", **env_args, max_turns=max_turns)
    rng = random.Random(f"oracle-cuts/{seed}")
    student = {} if labels == "demonstration" else sampled_turns(policy, "household/train", task_ids, env_args=env_args,
                                                                  seed=seed)
    rows = []
    for task_id in task_ids:
        task = env.get_task(task_id)
        plans = ([(list(task.privileged["demonstration"]), set())] if labels == "demonstration" else
                 [after_student(scratch, task, student[task_id], rng, max_turns)[2:] for _ in range(cuts)])
        for actions, masked in plans:
            (ids, mask), episode = scripted_example(policy, env, task_id, actions, masked)
            if not episode.success:  # a student's history that outgrew the context budget
                continue
            if labels == "first":  # keep the one label on the student's own state
                if not masked:  # `after_student` fell back to the demonstration (no room to continue)
                    continue
                start, end = action_spans(mask)[0]
                mask = [int(start <= i < end) for i in range(len(mask))]
            rows.append((ids, mask))
    return rows


def main(argv: list[str] | None = None) -> int:
    import torch

    from agentgym_opd.policy.hf import HFPolicy
    from agentgym_opd.registry import make
    from evaluation.bench import base_models
    from evaluation.bench.base_training import accumulate_batch_gradient
    from evaluation.bench.settings import BenchSettings
    from mistake_probe import success_with_mistakes

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("student", help="the student's model folder (e.g. a base model's .../model)")
    parser.add_argument("--rollouts", type=int, default=128, help="train tasks the student plays (sampled)")
    parser.add_argument("--cuts", type=int, default=4, help="random cuts per rollout")
    parser.add_argument("--labels", default="first", choices=LABELS)
    parser.add_argument("--steps", type=int, default=32, help="AdamW steps of 8 rows")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--eval-tasks", type=int, default=100, help="greedy episodes on valid_seen after every half")
    parser.add_argument("--max-turns", type=int, default=BenchSettings.max_turns)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    policy = HFPolicy.from_pretrained(args.student)
    env_args = base_models.base_env_args(base_models.STUDENT_SPEC)
    tasks = random.Random(f"oracle-tasks/{args.seed}").sample(make("household/train", **env_args).task_ids(), args.rollouts)
    rows = oracle_examples(policy, tasks, labels=args.labels, cuts=args.cuts, env_args=env_args, seed=args.seed)

    def evaluate() -> str:
        policy.model.eval()
        success, errors = success_with_mistakes(policy, 0.0, split="valid_seen", tasks=args.eval_tasks,
                                                env_args=env_args, max_turns=args.max_turns)
        return f"{success:.3f} | {errors:.2f}"

    print(f"{len(rows)} rows ({args.labels} labels) from {args.rollouts} tasks")
    print("| steps | valid_seen success | invalid actions per episode |\n|---|---|---|")
    print(f"| 0 | {evaluate()} |", flush=True)
    optimiser = torch.optim.AdamW(policy.model.parameters(), lr=args.lr, weight_decay=0.0)
    order = random.Random(f"oracle-batches/{args.seed}")
    for step in range(1, args.steps + 1):
        policy.model.train()
        optimiser.zero_grad(set_to_none=True)
        accumulate_batch_gradient(policy.model, order.sample(rows, min(8, len(rows))))
        torch.nn.utils.clip_grad_norm_(policy.model.parameters(), 1.0)
        optimiser.step()
        if step % max(1, args.steps // 2) == 0:
            print(f"| {step} | {evaluate()} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Does an OPD step move the student toward its teacher, and does that make the student better?

Two questions get mixed up when on-policy distillation shows no gain: is the loss doing its job (the student's
next-token distribution gets closer to the teacher's), and does closer mean more successful? This probe
answers the first on its own. It samples the student's rollouts on two disjoint slices of the train split
(one to train on, one fresh), then takes OPD update steps on the first and after each reports, on both:

* the mean reverse KL(student || teacher) per agent token, the teacher reading exactly the student's tokens
  (OPD's own view of a batch, computed here independently of the algorithm's code);
* the share of agent tokens where the two models' most likely next token is the same.

Falling KL on the trained batch checks the update; falling KL and rising agreement on the fresh rollouts
check that it generalises. ``--eval-tasks N`` adds the student's greedy success on the first N tasks of
`valid_seen` (the bench's seed-0 block) before the first and after the last step, which answers the second
question at the cost of N episodes per point. ``--states teacher`` trains on rollouts the teacher played
(the same loss on the teacher's own states: distillation off-policy), the contrast that tells whether the
states or the signal is at fault when on-policy steps hurt:

    python scripts/probes/distill_probe.py STUDENT_MODEL TEACHER_MODEL --lr 1e-4 --steps 6
    python scripts/probes/distill_probe.py S T --lr 3e-4 --steps 16 --tasks 32 --divergence forward_kl \
        --max-turns 20 --eval-tasks 100 [--states teacher]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch


def divergence_to_teacher(student: Any, teacher: Any, batch: Any) -> tuple[float, float]:
    """(mean reverse KL(student || teacher) over the batch's agent tokens, share of those tokens where the
    two models' argmax agree). Both models score the batch's own ids with its attention mask."""
    with torch.no_grad():
        ids, attention = batch.input_ids, batch.attention_mask
        s = torch.log_softmax(student.model(input_ids=ids, attention_mask=attention).logits[:, :-1].float(), -1)
        t = torch.log_softmax(teacher.model(input_ids=ids, attention_mask=attention).logits[:, :-1].float(), -1)
        agent = batch.loss_mask[:, 1:].bool()
        kl = (s.exp() * (s - t)).sum(-1)[agent]
        agree = (s.argmax(-1) == t.argmax(-1))[agent].float()
    return float(kl.mean()), float(agree.mean())


def probe(student: Any, teacher: Any, *, lr: float, steps: int, env_args: dict[str, Any] | None = None,
          tasks: int = 8, temperature: float = 1.0, max_turns: int = 30, seed: int = 0, divergence: str = "reverse_kl",
          states: str = "student", eval_tasks: int = 0) -> list[dict[str, float]]:
    """One row per point (step 0 = before any update): KL and agreement on the trained and on fresh rollouts,
    OPD's own loss at that step (with reverse KL, equal to the trained batch's KL before the step), and with
    ``eval_tasks`` the student's greedy `valid_seen` success at the first and the last point."""
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.registry import env_protocol, make
    from agentgym_opd.rollout import RolloutEngine
    from algorithms.opd import OPD
    from mistake_probe import success_with_mistakes

    env_id = "household/train"
    overrides = {**(env_args or {}), "max_turns": max_turns}
    envs = [make(env_id, **overrides) for _ in range(tasks)]
    ids = envs[0].task_ids()
    protocol = env_protocol(env_id)
    if states not in ("student", "teacher"):
        raise ValueError(f"states must be 'student' or 'teacher', got {states!r}")

    def engine(policy: Any) -> RolloutEngine:
        return RolloutEngine(policy, SamplingParams(max_new_tokens=16, temperature=temperature), max_context_tokens=4096,
                             system_prompt=protocol.system_prompt, action_parser=protocol.action_parser)

    player = student if states == "student" else teacher  # "teacher": the teacher's own play, off-policy
    trained = engine(player).collect(envs, ids[:tasks], seed=seed)
    fresh = engine(student).collect(envs, ids[tasks:2 * tasks], seed=seed + 1)
    for env in envs:
        env.close()
    algo = OPD({"divergence": divergence}, student, teacher,
               optimizer=torch.optim.AdamW(student.model.parameters(), lr=lr))
    rows = []
    for step in range(steps + 1):
        kl_t, agree_t = divergence_to_teacher(student, teacher, trained)
        kl_f, agree_f = divergence_to_teacher(student, teacher, fresh)
        row = {"step": step, "kl_trained": kl_t, "agree_trained": agree_t, "kl_fresh": kl_f, "agree_fresh": agree_f}
        if eval_tasks and step in (0, steps):  # the split's first tasks = the bench's seed-0 block
            row["valid_seen_success"] = success_with_mistakes(student, 0.0, split="valid_seen", tasks=eval_tasks,
                                                              env_args=env_args, max_turns=max_turns)[0]
        if step < steps:
            row["opd_loss"] = algo.update(trained)["loss"]
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    from agentgym_opd.policy.hf import HFPolicy
    from evaluation.bench import base_models

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("student", help="the student's model folder (e.g. a base model's .../model)")
    parser.add_argument("teacher", help="the teacher's model folder (same tokenizer)")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tasks", type=int, default=8, help="rollouts per slice (trained / fresh)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the trained rollouts")
    parser.add_argument("--divergence", default="reverse_kl", choices=("reverse_kl", "forward_kl", "jsd"))
    parser.add_argument("--states", default="student", choices=("student", "teacher"),
                        help="whose rollouts to train on (student: on-policy, OPD; teacher: its own play)")
    parser.add_argument("--eval-tasks", type=int, default=0,
                        help="greedy valid_seen success on this many tasks before and after (0: skip)")
    parser.add_argument("--max-turns", type=int, default=30,
                        help="turn limit per episode (30: README's figures; the bench plays 20, BenchSettings.max_turns)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    student, teacher = HFPolicy.from_pretrained(args.student), HFPolicy.from_pretrained(args.teacher)
    rows = probe(student, teacher, lr=args.lr, steps=args.steps, tasks=args.tasks, seed=args.seed,
                 env_args=base_models.base_env_args(base_models.STUDENT_SPEC), max_turns=args.max_turns,
                 temperature=args.temperature, divergence=args.divergence, states=args.states, eval_tasks=args.eval_tasks)
    print("| step | OPD loss | KL, trained batch | agreement, trained | KL, fresh rollouts | agreement, fresh |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        loss = f"{r['opd_loss']:.4f}" if "opd_loss" in r else ""
        print(f"| {r['step']} | {loss} | {r['kl_trained']:.4f} | {r['agree_trained']:.3f} | {r['kl_fresh']:.4f} | "
              f"{r['agree_fresh']:.3f} |", flush=True)
    for r in rows:
        if "valid_seen_success" in r:
            print(f"greedy valid_seen success after {r['step']} steps: {r['valid_seen_success']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

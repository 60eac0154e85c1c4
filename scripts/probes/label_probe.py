"""Is the teacher right where the student goes? The teacher's labels on the student's own states.

On-policy distillation trains the student toward the teacher's next-token distribution on the states the
student reaches, not on the states the teacher reaches when it plays. A teacher that plays well can still be
a poor guide on the student's states, above all after the student's mistakes, which the teacher's own play
rarely produces. This probe measures that directly. It samples the student's rollouts on train tasks; at
every turn it asks the teacher for its greedy action from exactly the student's history (the same token
prefix, parsed by the env family's parser), replays the episode's earlier actions on a fresh env and steps
the teacher's action there. Each turn is classed as *clean* (no invalid action earlier in the episode) or
*after an error*, and for each class it reports:

* the share of the student's own actions the env rejected;
* the share of the teacher's labels the env would reject (a parse error counts as rejected);
* the share of turns where the teacher's label is the student's reply, token for token.

It needs an env whose episodes replay exactly from the task id and the actions (the household env does):

    python scripts/probes/label_probe.py STUDENT_MODEL TEACHER_MODEL --tasks 48 --temperature 1.0 --max-turns 20
"""

from __future__ import annotations

import argparse
import random
from typing import Any

CLASSES = ("clean", "after_error")


def teacher_labels(teacher: Any, batch: Any, row: int, max_new_tokens: int = 16) -> list[tuple[str, str, list[int]]]:
    """The teacher's greedy reply (text, finish reason, token ids) at each of the row's turns, from the exact
    token prefix the student saw; ("", "length", []) where a turn has no sampled tokens."""
    from agentgym_opd.policy.base import SamplingParams

    n = int(batch.attention_mask[row].sum())
    ids, turn_index, agent = batch.input_ids[row, :n], batch.turn_index[row, :n], batch.loss_mask[row, :n].bool()
    prefixes = []
    for k in range(len(batch.episodes[row].turns)):
        first = ((turn_index == k) & agent).nonzero().flatten()
        if len(first) == 0:  # a turn without sampled tokens (cut by the context limit): no prefix to ask from
            prefixes.append(None)
            continue
        prefixes.append(ids[: int(first[0])].tolist())
    asked = [p for p in prefixes if p is not None]
    gens = iter(teacher.generate(asked, SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0)) if asked else [])
    labels = []
    for prefix in prefixes:
        gen = next(gens) if prefix is not None else None
        labels.append((gen.text, gen.finish_reason, list(gen.token_ids)) if gen is not None else ("", "length", []))
    return labels


def label_rejected(env: Any, task_id: Any, earlier: list[str], label: tuple[str, str, list[int]], parse: Any) -> bool:
    """Would the env reject the reply ``label`` after replaying ``earlier`` (the actions the env saw) from the
    task's start? A reply the parser rejects counts as rejected."""
    action, error = parse(label[0], label[1])
    if error is not None:
        return True
    env.reset(options={"task_id": task_id})
    for previous in earlier:
        env.step(previous)
    return env.step(action)[4].get("error") is not None


def probe(student: Any, teacher: Any, *, tasks: int = 48, temperature: float = 1.0, max_turns: int = 20,
          env_args: dict[str, Any] | None = None, seed: int = 0) -> dict[str, dict[str, float]]:
    """Per class (`CLASSES`): turns, share of all turns, student's rejected share, teacher label's rejected
    share, and the share where the label is the student's reply token for token."""
    from agentgym_opd.action_parsing import get_parser
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.registry import env_protocol, make
    from agentgym_opd.rollout import RolloutEngine

    env_id = "household/train"
    overrides = {**(env_args or {}), "max_turns": max_turns}
    envs = [make(env_id, **overrides) for _ in range(tasks)]
    task_ids = random.Random(seed).sample(envs[0].task_ids(), tasks)
    protocol = env_protocol(env_id)
    engine = RolloutEngine(student, SamplingParams(max_new_tokens=16, temperature=temperature), max_context_tokens=4096,
                           system_prompt=protocol.system_prompt, action_parser=protocol.action_parser)
    batch = engine.collect(envs, task_ids, seed=seed)
    parse = get_parser(protocol.action_parser)
    replay = make(env_id, **{**overrides, "max_turns": 2 * max_turns})  # the replay must not end before the label
    counts = {c: {"turns": 0, "student_rejected": 0, "teacher_rejected": 0, "same": 0} for c in CLASSES}
    for row, episode in enumerate(batch.episodes):
        labels = teacher_labels(teacher, batch, row)
        seen_error = False
        for k, (turn, label) in enumerate(zip(episode.turns, labels)):
            c = counts["after_error" if seen_error else "clean"]
            c["turns"] += 1
            c["student_rejected"] += turn.error is not None
            stepped = [t.action for t in episode.turns[:k] if not t.info.get("parse_error")]  # the env saw these
            c["teacher_rejected"] += label_rejected(replay, episode.task.id, stepped, label, parse)
            c["same"] += label[2] == list(turn.action_token_ids)  # the very tokens the student sampled
            seen_error = seen_error or turn.error is not None
    for env in [*envs, replay]:
        env.close()
    total = sum(c["turns"] for c in counts.values()) or 1
    return {name: {"turns": c["turns"], "share_of_turns": c["turns"] / total,
                   **{k: c[k] / c["turns"] if c["turns"] else float("nan")
                      for k in ("student_rejected", "teacher_rejected", "same")}}
            for name, c in counts.items()}


def main(argv: list[str] | None = None) -> int:
    import torch

    from agentgym_opd.policy.hf import HFPolicy
    from evaluation.bench import base_models
    from evaluation.bench.settings import BenchSettings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("student", help="the student's model folder (e.g. a base model's .../model)")
    parser.add_argument("teacher", help="the teacher's model folder (same tokenizer)")
    parser.add_argument("--tasks", type=int, default=48, help="student rollouts on train tasks")
    parser.add_argument("--temperature", type=float, default=1.0, help="the student's sampling temperature (OPD's)")
    parser.add_argument("--max-turns", type=int, default=BenchSettings.max_turns)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    student, teacher = HFPolicy.from_pretrained(args.student), HFPolicy.from_pretrained(args.teacher)
    rows = probe(student, teacher, tasks=args.tasks, temperature=args.temperature, max_turns=args.max_turns,
                 env_args=base_models.base_env_args(base_models.STUDENT_SPEC), seed=args.seed)
    print("| turns | n | share | student's action rejected | teacher's label rejected | label = student's reply |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['turns']} | {r['share_of_turns']:.2f} | {r['student_rejected']:.3f} | "
              f"{r['teacher_rejected']:.3f} | {r['same']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

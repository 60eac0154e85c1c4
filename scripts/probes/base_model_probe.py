"""Which decisions a household model has learned: teacher-forced accuracy of the observable expert's actions.

Episode success multiplies the accuracy of 15-30 decisions, so a model that gets 90% of them right still
solves few tasks, and a success of 0 says nothing about why. This probe replays the expert's demonstrations
of a split (the same token sequences the base models train on) and asks, at every action, whether the
model's greedy next tokens spell exactly the expert's action, given the expert's history. It reports the
accuracy per kind of decision, which separates the decisions that read only the latest observation (open
what is closed, go to the neighbour it names) from those that need the goal or an earlier turn (take the
wanted object, go to the target or the appliance, put or treat the object in hand):

    python scripts/probes/base_model_probe.py PATH/TO/MODEL --split valid_unseen --tasks 60
"""

from __future__ import annotations

import argparse
import collections
import re
from typing import Any

APPLIANCES = ("microwave", "fridge", "sinkbasin")
_NEXT_TO = re.compile(r"Next to it, you see the (.*?)\.")
_GOAL = re.compile(r"Your task is to: (.*?)\.\n")


def decision_kind(action: str, index: int, last_observation: str, goal: str) -> str:
    """The kind of one expert decision: go_first / go_neighbour / go_target / go_appliance / go_other, or the verb."""
    if not action.startswith("go to "):
        return action.split(" ", 1)[0]
    dest = action[len("go to "):]
    named = _NEXT_TO.findall(last_observation)
    if index == 0:
        return "go_first"
    if named and named[-1] == dest:
        return "go_neighbour"
    if re.search(rf"\b{re.escape(dest)}\b", goal):
        return "go_target"
    if dest.split(" ")[0] in APPLIANCES:
        return "go_appliance"
    return "go_other"


def probe(model: Any, tokenizer: Any, *, split: str = "valid_unseen", tasks: int = 60,
          env_args: dict[str, Any] | None = None) -> dict[str, dict[str, float]]:
    """Per decision kind: {"n": actions, "accuracy": share the model predicts exactly}; "all" pools them."""
    import dataclasses

    import torch

    from agentgym_opd.policy.hf import HFPolicy
    from evaluation.bench import base_models
    from evaluation.bench.base_data import training_examples
    from evaluation.bench.base_training import action_spans

    spec = dataclasses.replace(base_models.STUDENT_SPEC, train_tasks=tasks, context_share=0.0)
    if env_args is not None:
        spec = dataclasses.replace(spec, status_line=bool(env_args.get("status_line")),
                                   goal_in_view=bool(env_args.get("goal_in_view")),
                                   turn_counter=bool(env_args.get("turn_counter")))
    examples = training_examples(HFPolicy(model, tokenizer), spec, env_id=f"household/{split}")
    total, right = collections.Counter(), collections.Counter()
    model.eval()
    with torch.no_grad():
        for ids, mask in examples:
            x = torch.tensor([ids])
            predicted = model(x).logits[0].argmax(-1)
            text = tokenizer.decode(ids)
            goal_match = _GOAL.search(text)
            goal = goal_match.group(1) if goal_match else ""
            for k, (a, b) in enumerate(action_spans(mask)):
                action = tokenizer.decode(ids[a:b], skip_special_tokens=True).strip()
                last_user = tokenizer.decode(ids[:a]).rsplit("<|im_start|>user\n", 1)[-1]
                kind = decision_kind(action, k, last_user, goal)
                good = bool((predicted[a - 1:b - 1] == x[0, a:b]).all())
                for key in (kind, "all"):
                    total[key] += 1
                    right[key] += good
    return {k: {"n": total[k], "accuracy": right[k] / total[k]} for k in sorted(total)}


def format_probe(result: dict[str, dict[str, float]]) -> str:
    lines = ["| decision | actions | teacher-forced accuracy |", "|---|---|---|"]
    lines += [f"| {k} | {v['n']} | {v['accuracy']:.2f} |" for k, v in result.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a household model folder (e.g. a base model's .../model)")
    parser.add_argument("--split", default="valid_unseen", choices=("train", "valid_seen", "valid_unseen"))
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--no-status-line", action="store_true", help="play the env without its status line")
    parser.add_argument("--no-goal-in-view", action="store_true", help="a status line without 'Wanted here: ...'")
    parser.add_argument("--no-turn-counter", action="store_true", help="a status line without 'Step N next.'")
    args = parser.parse_args(argv)
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, local_files_only=True)
    result = probe(model, tokenizer, split=args.split, tasks=args.tasks,
                   env_args={"status_line": not args.no_status_line,
                             "goal_in_view": not args.no_status_line and not args.no_goal_in_view,
                             "turn_counter": not args.no_status_line and not args.no_turn_counter})
    print(format_probe(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

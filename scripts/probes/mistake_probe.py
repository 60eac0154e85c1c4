"""How a household model copes with mistakes in its own history: greedy success when some actions go wrong.

On-policy distillation asks the teacher about the student's histories, and a student under training makes
many invalid commands (about half its turns at temperature 1.0, for the bench's student). A teacher that
has only seen flawless expert histories may be lost after such a turn. This probe plays a model greedily
and, with probability ``rate`` per turn, changes the first number in the action it chose ("take cup 2
from shelf 1" becomes "take cup 3 from shelf 1"), which the env usually rejects; the history then carries
the mistake, as a student's would. Success at rate 0 is the plain greedy evaluation:

    python scripts/probes/mistake_probe.py PATH/TO/MODEL --split valid_seen --tasks 60 --rates 0,0.1,0.25
"""

from __future__ import annotations

import argparse
import random
import re
from typing import Any, Sequence

_NUMBER = re.compile(r"\d+")


def mistaken(action: str) -> str:
    """The action with its first number moved on by one (within 1-6, the numbers rooms use), or unchanged."""
    return _NUMBER.sub(lambda m: str(int(m.group()) % 6 + 1), action, count=1)


class MistakenPolicy:
    """A policy whose sampled action is, with probability ``rate`` per turn, replaced by `mistaken` of it.

    Whether a turn goes wrong is seeded by the engine's per-row, per-turn seed, so a rerun makes the same
    mistakes. The replaced tokens carry log-prob 0 (nothing trains on them)."""

    def __init__(self, policy: Any, rate: float):
        self.policy, self.rate = policy, rate
        self.tokenizer, self.stop_token_ids = policy.tokenizer, policy.stop_token_ids

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.policy.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    def generate(self, prompts: list[list[int]], params: Any, seeds: Sequence[int | None] | None = None) -> list[Any]:
        from agentgym_opd.policy.base import Generation

        out = []
        for k, gen in enumerate(self.policy.generate(prompts, params, seeds=seeds)):
            seed = seeds[k] if seeds is not None else k
            if random.Random(f"mistake/{seed}").random() < self.rate and mistaken(gen.text) != gen.text:
                text = mistaken(gen.text)
                closing = [t for t in gen.token_ids[-1:] if t in self.stop_token_ids]
                ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + closing
                gen = Generation(text, ids, [0.0] * len(ids), gen.finish_reason)
            out.append(gen)
        return out


def success_with_mistakes(policy: Any, rate: float, *, split: str = "valid_seen", tasks: int = 60,
                          env_args: dict[str, Any] | None = None, max_turns: int = 30) -> tuple[float, float]:
    """(success rate, invalid actions per episode) of greedy play on the split's first ``tasks`` tasks, played
    as the bench evaluates (`agentgym_opd.playing.play_tasks`, the family's parser and system prompt)."""
    from agentgym_opd.playing import play_tasks
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.registry import env_protocol, make

    env_id = f"household/{split}"
    overrides = {**(env_args or {}), "max_turns": max_turns}
    probe = make(env_id, **overrides)
    ids = probe.task_ids()[:tasks]
    probe.close()
    protocol = env_protocol(env_id)
    episodes = play_tasks(MistakenPolicy(policy, rate), env_id, ids,
                          sampling=SamplingParams(max_new_tokens=16, temperature=0.0),
                          action_parser=protocol.action_parser, system_prompt=protocol.system_prompt,
                          batch_size=len(ids), max_context_tokens=4096, env_kwargs=overrides)
    errors = sum(t.error is not None for e in episodes for t in e.turns)
    return sum(e.success for e in episodes) / len(episodes), errors / len(episodes)


def main(argv: list[str] | None = None) -> int:
    import torch

    from agentgym_opd.policy.hf import HFPolicy
    from evaluation.bench import base_models

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a household model folder (e.g. a base model's .../model)")
    parser.add_argument("--split", default="valid_seen", choices=("train", "valid_seen", "valid_unseen"))
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--rates", default="0,0.1,0.25", help="comma list of per-turn mistake probabilities")
    parser.add_argument("--max-turns", type=int, default=30,
                        help="turn limit per episode (30: README's figures; the bench plays 20, BenchSettings.max_turns)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    policy = HFPolicy.from_pretrained(args.model)
    env_args = base_models.base_env_args(base_models.STUDENT_SPEC)
    print("| mistake rate | success | invalid actions per episode |\n|---|---|---|")
    for rate in (float(r) for r in args.rates.split(",")):
        success, errors = success_with_mistakes(policy, rate, split=args.split, tasks=args.tasks, env_args=env_args,
                                                max_turns=args.max_turns)
        print(f"| {rate:g} | {success:.3f} | {errors:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

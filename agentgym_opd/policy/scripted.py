"""Scripted agents as a Policy, so they play through the one rollout engine like any network.

An *agent* is a callable ``(observation, info) -> action``: it decides from what the env last said (and
``info["task"]``, ``info["turn"]``, ``info["admissible_actions"]``), not from tokens. `ScriptedPolicy`
wraps one so that `RolloutEngine` can play it: the engine hands a scripted policy each row's latest env
view instead of asking it to sample (`ScriptedPolicy.act`), and keeps the same token bookkeeping, turn
limits, crash replay and episode records as for a model. So an expert's episode for SFT, a walkthrough
upper bound and a random baseline are recorded exactly as a student's rollout would be.

Tokens: a scripted reply is its action text tokenised, plus the end-of-turn token where the tokenizer has
a special one. Pass ``like=`` a policy to use its tokenizer and chat template (SFT's expert episodes must
be in the student's tokens); without it the tiny model's tokenizer (byte-level BPE, so any text round-trips)
does the bookkeeping, since nobody trains on those ids. Log-probs are 0: a scripted policy has none.

All agents here are stateless across episodes (everything they need is in ``info``), so one instance
serves every row of a batch, and an episode replayed after a crash gets exactly the same actions.
"""

from __future__ import annotations

import random
import zlib
from typing import Any, Callable, Sequence

from agentgym_opd.policy.base import Generation

Agent = Callable[[str, dict[str, Any]], str]
EnvView = tuple[str, dict[str, Any]]  # (the env's latest observation, its info with "task" and "turn")


class ScriptAgent:
    """Says ``actions[turn]`` on env turn ``turn``: a fixed plan (e.g. a demonstration with context)."""

    def __init__(self, actions: Sequence[str], fallback: str | None = None):
        self.actions = list(actions)
        self.fallback = fallback  # sent once the plan is exhausted; None = running out is an error

    def plan(self, info: dict[str, Any]) -> list[str]:
        return self.actions

    def __call__(self, observation: str, info: dict[str, Any]) -> str:
        actions = self.plan(info)
        turn = int(info.get("turn", 0))
        if turn < len(actions):
            return actions[turn]
        if self.fallback is None:
            task = info.get("task")
            raise RuntimeError(f"the script of {len(actions)} actions ran out before the episode of "
                               f"{getattr(task, 'id', '?')!r} ended")
        return self.fallback


class WalkthroughAgent(ScriptAgent):
    """Replays the task's ``privileged["walkthrough"]``, one expert action per turn (an upper bound)."""

    def __init__(self, fallback: str | None = "look"):
        super().__init__([], fallback)

    def plan(self, info: dict[str, Any]) -> list[str]:
        task = info.get("task")
        if task is None:
            raise ValueError("WalkthroughAgent needs info['task'] (the rollout engine passes it on every turn)")
        walkthrough = task.privileged.get("walkthrough")
        if not walkthrough:
            raise ValueError(f"task {task.id!r} has no privileged['walkthrough'] to replay")
        return walkthrough


class RandomAdmissibleAgent:
    """Picks uniformly among ``info["admissible_actions"]`` (or ``fallback_actions`` where the env lists none).

    The choice is seeded by (seed, task id, turn) rather than by one shared generator, so it does not depend
    on how episodes are interleaved across workers: the local and the Ray executor see the same actions.
    """

    def __init__(self, seed: int = 0, fallback_actions: tuple[str, ...] = ("look",)):
        if not fallback_actions:
            raise ValueError("fallback_actions must not be empty")
        self.seed = seed
        self.fallback_actions = tuple(fallback_actions)

    def __call__(self, observation: str, info: dict[str, Any]) -> str:
        actions = info.get("admissible_actions") or list(self.fallback_actions)
        task = info.get("task")
        key = f"{self.seed}|{task.id if task is not None else ''}|{info.get('turn', 0)}"
        rng = random.Random(zlib.crc32(key.encode()))
        return rng.choice(sorted(actions))


class TemplateTokens:
    """A tokenizer with its chat template, shaped like a policy's bookkeeping side (no network)."""

    def __init__(self, tokenizer: Any):
        from agentgym_opd.policy.chat import end_of_turn_token_ids

        self.tokenizer = tokenizer
        self.stop_token_ids = end_of_turn_token_ids(tokenizer)

    @classmethod
    def tiny(cls) -> "TemplateTokens":
        """The tiny model's tokenizer (built once into the cache)."""
        from transformers import AutoTokenizer

        from agentgym_opd.policy.tiny import default_tiny_model

        return cls(AutoTokenizer.from_pretrained(default_tiny_model()))

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        from agentgym_opd.policy.chat import prompt_ids

        return prompt_ids(self.tokenizer, messages, add_generation_prompt)


class ScriptedPolicy:
    """A Policy whose replies come from ``agent``; `RolloutEngine` calls `act` with each row's env view."""

    def __init__(self, agent: Agent, like: Any = None):
        like = like if like is not None else TemplateTokens.tiny()
        self.agent = agent
        self.like = like
        self.tokenizer = like.tokenizer
        self.stop_token_ids = list(getattr(like, "stop_token_ids", []))
        from agentgym_opd.policy.chat import end_of_turn_text

        eot = self.tokenizer.encode(end_of_turn_text(self.tokenizer), add_special_tokens=False)
        self.end_of_turn = [eot[0]] if eot and eot[0] in self.stop_token_ids else []

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.like.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    def act(self, views: Sequence[EnvView]) -> list[Generation]:
        """One reply per row: the agent's action, tokenised and closed like a sampled turn."""
        out = []
        for observation, info in views:
            action = self.agent(observation, info)
            ids = list(self.tokenizer.encode(action, add_special_tokens=False)) + self.end_of_turn
            out.append(Generation(action, ids, [0.0] * len(ids), "stop"))
        return out

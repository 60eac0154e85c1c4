"""Several registered envs as one: the env id ``a+b`` is the union of the tasks of ``a`` and ``b``.

Why: a run that routes tasks to several teachers by env (:mod:`agentgym_opd.teachers`) must train on tasks of
several envs in one batch, and the trainer, the rollout engine and evaluation all take one env id. So
``agentgym_opd.make("household/train-pick_and_place+household/train-pick_heat_then_place")`` (or
``--env a+b``) makes a :class:`MixtureEnv`: its task ids are ``<member env id>::<member task id>``, ``reset``
with such a task id resets that member, and every step is the member's own step (its ``info``, its errors,
its turn limit). A task keeps its member's ``env_id``, which is what routing by env reads.

One protocol: the rollout engine reads every reply with one action parser and shows one system prompt, so the
members must register the same ones, or the run sets ``rollout.action_parser`` and ``rollout.system_prompt``
itself (then every member reads replies that way); otherwise :func:`mixture_protocol` refuses, naming both.
Constructor options (``--env-arg``) go to every member; a member that does not take one says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentgym_opd.core import TextEnv, UnknownTaskError
from agentgym_opd.types import Task

SEPARATOR = "+"
TASK_SEPARATOR = "::"


def is_mixture_id(env_id: str) -> bool:
    return isinstance(env_id, str) and SEPARATOR in env_id


def member_ids(env_id: str) -> list[str]:
    """The member env ids of ``a+b+...``; empty or repeated members are an error."""
    members = env_id.split(SEPARATOR)
    if any(not m.strip() for m in members):
        raise ValueError(f"env id {env_id!r}: a mixture joins registered env ids with '+', e.g. "
                         "household/train+tooluse/train (no empty member)")
    if len(set(members)) != len(members):
        raise ValueError(f"env id {env_id!r} names a member twice")
    return members


class MixtureEnv(TextEnv):
    """The union of several envs' tasks; each episode is played by the member env its task belongs to."""

    description = "a mixture of registered envs"

    def __init__(self, members: dict[str, TextEnv], *, env_id: str | None = None):
        if len(members) < 2:
            raise ValueError("a mixture needs at least two member envs")
        self.members = dict(members)
        turns = max(m.max_turns for m in self.members.values())
        super().__init__(split=SEPARATOR.join(m.split for m in self.members.values()), max_turns=turns,
                         env_id=env_id or SEPARATOR.join(self.members))
        self.active: TextEnv | None = None

    def _split_task_id(self, task_id: str) -> tuple[TextEnv, str]:
        member, sep, inner = str(task_id).partition(TASK_SEPARATOR)
        if not sep or member not in self.members:
            raise UnknownTaskError(task_id, self.task_ids()[:50])
        return self.members[member], inner

    def task_ids(self) -> list[str]:
        return [f"{name}{TASK_SEPARATOR}{t}" for name, env in self.members.items() for t in env.task_ids()]

    def get_task(self, task_id: str) -> Task:
        env, inner = self._split_task_id(task_id)
        return env.get_task(inner)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        options = dict(options or {})
        if "task_id" in options:
            env, options["task_id"] = self._split_task_id(options["task_id"])
        else:  # no task named: the seed picks a member, then the member picks its task
            rng = np.random.default_rng(seed)
            env = list(self.members.values())[int(rng.integers(len(self.members)))]
        self.active = env
        self.max_turns = env.max_turns  # the rollout engine reads the turn limit after reset
        obs, info = env.reset(seed=seed, options=options)
        self.task, self.done = info["task"], False
        return obs, info

    def step(self, action: str):
        if self.active is None:
            from agentgym_opd.core import EnvMisuseError

            raise EnvMisuseError(f"{self.env_id}: call reset() before step()")
        out = self.active.step(action)
        self.done = bool(out[2] or out[3])
        return out

    def admissible_actions(self) -> list[str] | None:
        return self.active.admissible_actions() if self.active is not None else None

    def render(self):
        return self.active.render() if self.active is not None else None

    def close(self) -> None:
        for env in self.members.values():
            env.close()


def make_mixture(env_id: str, **overrides: Any) -> MixtureEnv:
    """``make("a+b", **overrides)``: each member made with the same overrides."""
    from agentgym_opd.registry import make

    overrides.pop("env_id", None)
    return MixtureEnv({member: make(member, **overrides) for member in member_ids(env_id)}, env_id=env_id)


def mixture_protocol(env_id: str, *, action_parser: str | None = None, system_prompt: str | None = None) -> Any:
    """The one protocol of a mixture: the members' common one, or the caller's (module docstring)."""
    from agentgym_opd.registry import env_protocol

    protocols = {member: env_protocol(member, action_parser=action_parser, system_prompt=system_prompt)
                 for member in member_ids(env_id)}
    distinct = {(p.action_parser, p.system_prompt) for p in protocols.values()}
    if len(distinct) > 1:
        described = "; ".join(f"{m}: parser {p.action_parser}, system prompt "
                              f"{'none' if not p.system_prompt else repr(p.system_prompt[:40] + '...')}"
                              for m, p in protocols.items())
        raise ValueError(f"the envs of {env_id} read replies differently ({described}); one run has one protocol: "
                         "set rollout.action_parser and rollout.system_prompt to use one for all, or mix envs of "
                         "one protocol")
    return next(iter(protocols.values()))

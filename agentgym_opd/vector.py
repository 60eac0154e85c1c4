"""Step many `TextEnv`s at once, in process.

Why not `gymnasium.vector.SyncVectorEnv`: it merges per-env `info` dicts into arrays with `_key` masks and
auto-resets finished envs, while a multi-turn rollout needs each env's own `Task`, `StepError` and end of
episode untouched, and envs that finish at different turns to simply drop out of the batch. So this
stepper keeps per-env results as lists and steps only the envs it is given actions for.

An action is agent text, and agent text is adversarial: whatever an env raises while stepping one (a
parser's RecursionError, a backend's bug) ends *that* episode with an `env_crash` StepError and the
other envs of the batch go on. Only misuse by the caller (`EnvMisuseError`: stepping a finished env)
still raises, because that is a bug in the code driving the envs, not in the agent's output.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from agentgym_opd.core import EnvMisuseError, TextEnv
from agentgym_opd.types import StepError

logger = logging.getLogger(__name__)
CRASH_MESSAGE_CHARS = 300  # of the exception's text, in the StepError a model may be shown


@dataclass(slots=True)
class StepResult:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class VectorTextEnv:
    """N independent envs; `reset` and `step` take and return one entry per env (None = leave it alone)."""

    def __init__(self, envs: Sequence[TextEnv] | None = None, *, env_fns: Sequence[Callable[[], TextEnv]] | None = None):
        if (envs is None) == (env_fns is None):
            raise ValueError("pass either envs=[...] or env_fns=[...]")
        self.envs: list[TextEnv] = list(envs) if envs is not None else [fn() for fn in env_fns]  # type: ignore[union-attr]
        if not self.envs:
            raise ValueError("VectorTextEnv needs at least one env")
        self.active = [False] * len(self.envs)

    @classmethod
    def make(cls, env_id: str, num_envs: int, **overrides: Any) -> "VectorTextEnv":
        from agentgym_opd.registry import make

        return cls([make(env_id, **overrides) for _ in range(num_envs)])

    def task_ids(self) -> list[str]:
        """The split's task ids (every env of a vector runs the same split)."""
        return self.envs[0].task_ids()

    @property
    def num_envs(self) -> int:
        return len(self.envs)

    def reset(
        self,
        seeds: Sequence[int | None] | None = None,
        options: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[tuple[str, dict[str, Any]]]:
        n = self.num_envs
        seeds = list(seeds) if seeds is not None else [None] * n
        options = list(options) if options is not None else [None] * n
        if len(seeds) != n or len(options) != n:
            raise ValueError(f"reset needs {n} seeds and {n} options, got {len(seeds)} and {len(options)}")
        out = [env.reset(seed=s, options=o) for env, s, o in zip(self.envs, seeds, options)]
        self.active = [True] * n
        return out

    def reset_at(
        self,
        indices: Sequence[int],
        seeds: Sequence[int | None],
        options: Sequence[dict[str, Any] | None],
    ) -> list[tuple[str, dict[str, Any]]]:
        """Reset only the envs in `indices` (the others keep running): how a rollout refills a finished slot."""
        if not (len(indices) == len(seeds) == len(options)):
            raise ValueError(f"reset_at needs as many seeds and options as indices, got {len(indices)}, {len(seeds)}, {len(options)}")
        out = []
        for i, seed, opts in zip(indices, seeds, options):
            out.append(self.envs[i].reset(seed=seed, options=opts))
            self.active[i] = True
        return out

    def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        """Step env i with actions[i]; None skips it (finished envs must be given None)."""
        if len(actions) != self.num_envs:
            raise ValueError(f"step needs {self.num_envs} actions (None to skip an env), got {len(actions)}")
        results: list[StepResult | None] = []
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            if action is None:
                results.append(None)
                continue
            if not self.active[i]:
                raise RuntimeError(f"env {i} is not running (finished or never reset); pass None for it")
            try:
                res = StepResult(*env.step(action))
            except EnvMisuseError:
                raise
            except Exception as exc:  # the env failed on this action: this episode ends, the batch goes on
                res = crash_result(env, exc)
            if res.done:
                self.active[i] = False
            results.append(res)
        return results

    def close(self) -> None:
        for env in self.envs:
            env.close()


def crash_result(env: TextEnv, exc: BaseException) -> StepResult:
    """The step result of an env that raised while handling an action: truncated, reward 0, `env_crash`.

    The env is marked done (its state after an exception is unknown), so only a reset uses it again."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > CRASH_MESSAGE_CHARS:
        text = text[: CRASH_MESSAGE_CHARS - 4] + " ..."
    message = f"The environment failed while handling this action ({text}); the episode ends here."
    logger.warning("%s: env_crash on turn %s: %s", getattr(env, "env_id", type(env).__name__),
                   getattr(env, "turn", "?"), text.replace("\n", " "))
    env.done = True
    turn = getattr(env, "turn", 0)
    info = {"turn": turn, "error": StepError("env_crash", message), "feedback": message, "success": False,
            "score": 0.0, "admissible_actions": None, "exception": type(exc).__name__}
    return StepResult(message, 0.0, False, True, info)

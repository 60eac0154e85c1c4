"""`make_vector_env`: pick the executor by config, so a rollout script says `executor="ray"` and nothing else.

Both executors offer the same surface the rollout engine needs: `reset`, `reset_at` (reset some slots
while the others keep running), `step`, `active`, `close`.
"""

from __future__ import annotations

from typing import Any

from agentgym_opd.vector import VectorTextEnv

EXECUTORS = ("local", "ray")


def make_vector_env(env_id: str, num_envs: int, executor: str = "local", *,
                    actor_options: dict[str, Any] | None = None, step_timeout_s: float | None = None,
                    **env_kwargs: Any):
    """`num_envs` copies of `env_id`: in this process (`"local"`) or one per Ray actor (`"ray"`).

    `actor_options` and `step_timeout_s` only mean something for Ray and are refused for `"local"`, so a
    config that asks for them never silently runs without them.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    if executor == "local":
        if actor_options is not None or step_timeout_s is not None:
            raise ValueError("actor_options and step_timeout_s apply to executor='ray' only")
        return VectorTextEnv.make(env_id, num_envs, **env_kwargs)
    if executor == "ray":
        from agentgym_opd.executors.ray_envs import RayVectorTextEnv  # ray is imported only when asked for

        return RayVectorTextEnv.make(env_id, num_envs, actor_options=actor_options,
                                     step_timeout_s=step_timeout_s, **env_kwargs)
    raise ValueError(f"unknown executor {executor!r}; expected one of {', '.join(EXECUTORS)}")


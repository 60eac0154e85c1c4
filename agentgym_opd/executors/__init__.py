"""Where envs run: in this process (`VectorTextEnv`) or one per Ray actor (`RayVectorTextEnv`).

Import-light on purpose: `ray` is imported only when the Ray executor is asked for, so the local path and
the CLI never pay for it (and never need it installed).
"""

from __future__ import annotations

from typing import Any

from agentgym_opd.executors.env_spec import EnvSpec
from agentgym_opd.executors.factory import EXECUTORS, make_vector_env

__all__ = ["EXECUTORS", "EnvSpec", "RayVectorTextEnv", "make_vector_env"]


def __getattr__(name: str) -> Any:
    if name == "RayVectorTextEnv":
        from agentgym_opd.executors.ray_envs import RayVectorTextEnv

        return RayVectorTextEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""How a worker builds its env: a registry id plus keyword overrides, or any picklable zero-argument factory.

Why a small value object instead of passing an env: an env worker lives in another process (a Ray actor),
and a JVM-backed env cannot be pickled, so what travels is the recipe. The same recipe builds the
replacement when a worker dies, which is what makes restarts transparent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from agentgym_opd.core import TextEnv


@dataclass(frozen=True)
class EnvSpec:
    """`env_id` + `kwargs` go through `agentgym_opd.make`; `env_fn` (a picklable callable) is used as is."""

    env_id: str | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    env_fn: Callable[[], TextEnv] | None = None

    def __post_init__(self) -> None:
        if (self.env_id is None) == (self.env_fn is None):
            raise ValueError("an EnvSpec needs exactly one of env_id=... or env_fn=...")
        if self.env_fn is not None and self.kwargs:
            raise ValueError("kwargs go with env_id; bind them into env_fn (e.g. functools.partial) instead")

    def build(self) -> TextEnv:
        if self.env_fn is not None:
            return self.env_fn()
        from agentgym_opd.registry import make

        return make(self.env_id, **self.kwargs)

    def describe(self) -> str:
        if self.env_id is not None:
            return self.env_id
        return getattr(self.env_fn, "__qualname__", None) or repr(self.env_fn)

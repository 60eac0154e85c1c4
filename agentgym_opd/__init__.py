"""agentgym-opd: multi-turn text environments and on-policy distillation algorithms, run the same way."""

from agentgym_opd.aliases import install as _install_aliases
from agentgym_opd.core import EnvMisuseError, StepOutcome, TextEnv, UnknownTaskError, fit_to_charset
from agentgym_opd.registry import (
    UnknownIdError,
    algorithm_registry,
    env_registry,
    list_algorithms,
    list_envs,
    make,
    make_algorithm,
    register,
    register_algorithm,
)
from agentgym_opd.types import ERROR_KINDS, Episode, ErrorKind, StepError, Task, Turn
from agentgym_opd.vector import StepResult, VectorTextEnv

__version__ = "0.1.0"

# `agentgym_opd.algorithms`, `agentgym_opd.environments`, ... name the top-level packages (the same module
# objects, mapped only when imported: agentgym_opd.aliases); before discovery, which may load entry points by them.
_install_aliases()

# Fill the env registry now, so gymnasium's own registry knows every id after `import agentgym_opd`
# (`gymnasium.make("household/train")`); algorithms stay lazy (nothing outside this package looks them up).
env_registry.discover()

__all__ = [
    "ERROR_KINDS",
    "EnvMisuseError",
    "Episode",
    "ErrorKind",
    "StepError",
    "StepOutcome",
    "StepResult",
    "Task",
    "TextEnv",
    "Turn",
    "UnknownIdError",
    "UnknownTaskError",
    "VectorTextEnv",
    "algorithm_registry",
    "env_registry",
    "fit_to_charset",
    "list_algorithms",
    "list_envs",
    "make",
    "make_algorithm",
    "register",
    "register_algorithm",
]

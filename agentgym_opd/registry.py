"""Registries of environments and algorithms, filled through entry points.

`register(id, entry_point="module:Class", **defaults)` records a spec; `make(id, **overrides)` imports
the entry point and calls it with the defaults updated by the overrides. The built-in environments and
algorithms are found exactly like a third-party plugin: each distribution lists, under the entry-point
groups `agentgym_opd.environments` and `agentgym_opd.algorithms`, one of: a `module:function` that calls
`register` (a family registering several ids), a `module:Class` (registered under the entry's name), or a
bare module that registers on import. The core never imports a plugin by name.

Environment specs are also registered in gymnasium's own registry, so `gymnasium.make("household/
valid_unseen")` works too (with gymnasium's checker and order wrappers) once `agentgym_opd` is imported:
importing the package discovers the env entry points (import-light: each family's `register_envs` only
records names, ~15 ms for the built-in ones). `agentgym_opd.make` returns the
bare env: `TextEnv` already enforces reset-before-step and its own turn limit.

An env id also carries its *protocol*: the action parser (a name in `agentgym_opd.action_parsing.PARSERS`
or "module:function") and the system prompt that follow the benchmark's own answer format.
`env_protocol(id)` returns them; run configs (`rollout.action_parser`, `rollout.system_prompt`) and
`agentgym-opd eval` flags override them, and result records state which were used.
"""

from __future__ import annotations

import dataclasses
import inspect
import difflib
import importlib
import logging
import threading
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable

import gymnasium

logger = logging.getLogger(__name__)

ENV_GROUP = "agentgym_opd.environments"
ALGO_GROUP = "agentgym_opd.algorithms"


class BadArgumentsError(TypeError):
    """``make(id, **kwargs)`` with a keyword the entry point does not take; the message lists what it takes."""


def accepted_arguments(factory: Any) -> str:
    """The keyword names of ``factory`` and of the ``__init__``s its ``**kwargs`` flow into (for error messages)."""
    names: list[str] = []
    targets = [c.__init__ for c in factory.__mro__ if "__init__" in vars(c)] if isinstance(factory, type) else [factory]
    for target in targets:
        try:
            params = inspect.signature(target).parameters.values()
        except (TypeError, ValueError):
            continue
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and p.name not in ("self", "env_id") and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return ", ".join(names) or "no keyword arguments"


class UnknownIdError(KeyError):
    """An id no registered spec has; the message lists the close matches and how to list all ids."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Spec:
    id: str
    entry_point: str | Callable[..., Any]
    defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    action_parser: str = "text"
    # the text, or a zero-argument callable returning it (a family whose prompt lives in a heavy module)
    system_prompt: str | Callable[[], str] | None = None


@dataclass(frozen=True)
class EnvProtocol:
    """How a model talks to an env: which parser reads its replies, which system prompt it sees."""

    action_parser: str
    system_prompt: str | None


def load_entry_point(entry_point: str | Callable[..., Any]) -> Callable[..., Any]:
    """Resolve "package.module:Attr" (or a callable) to the callable it names."""
    if callable(entry_point):
        return entry_point
    module_name, _, attr = entry_point.partition(":")
    if not attr:
        raise ValueError(f"entry point {entry_point!r} must look like 'package.module:Name'")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ImportError(f"entry point {entry_point!r}: module {module_name!r} has no attribute {attr!r}") from exc


class Registry:
    """A name -> spec table for one kind of thing, discovered lazily from one entry-point group."""

    def __init__(self, kind: str, group: str):
        self.kind = kind
        self.group = group
        self._specs: dict[str, Spec] = {}
        self._discovered = False
        self._lock = threading.RLock()
        self.plugin_errors: dict[str, str] = {}

    def register(
        self,
        id: str,
        entry_point: str | Callable[..., Any],
        *,
        description: str = "",
        override: bool = False,
        action_parser: str = "text",
        system_prompt: str | Callable[[], str] | None = None,
        **defaults: Any,
    ) -> Spec:
        if not isinstance(id, str) or not id:
            raise ValueError(f"a {self.kind} id is a non-empty string, got {id!r}")
        with self._lock:
            old = self._specs.get(id)
            if old is not None and not override and old.entry_point != entry_point:
                raise ValueError(
                    f"{self.kind} id {id!r} is already registered to {old.entry_point!r}; "
                    "pick another id or pass override=True"
                )
            spec = Spec(id, entry_point, dict(defaults), description, action_parser, system_prompt)
            self._specs[id] = spec
        self._on_register(spec)
        return spec

    def _on_register(self, spec: Spec) -> None:
        """Hook for subclasses (the env registry mirrors specs into gymnasium)."""

    def discover(self) -> None:
        """Load every entry point of the group once. A broken plugin is logged, not fatal for the others."""
        with self._lock:
            if self._discovered:
                return
            self._discovered = True
            for ep in metadata.entry_points(group=self.group):
                try:
                    loaded = ep.load()
                    if isinstance(loaded, type):  # `name = "pkg.mod:Class"`: register the class under the entry's name
                        if ep.name not in self._specs:
                            self.register(ep.name, loaded, description=(loaded.__doc__ or "").strip().split("\n")[0])
                    elif callable(loaded):  # `name = "pkg.mod:register_envs"`: a function that registers ids
                        loaded()
                    # a bare module registers its ids on import
                except Exception as exc:  # a third-party plugin must not take the registry down
                    self.plugin_errors[ep.name] = f"{type(exc).__name__}: {exc}"
                    logger.warning("agentgym-opd: %s plugin %r (%s) failed to load: %s", self.kind, ep.name, ep.value, exc)

    def spec(self, id: str) -> Spec:
        self.discover()
        try:
            return self._specs[id]
        except KeyError:
            pass
        known = sorted(self._specs)
        close = difflib.get_close_matches(id, known, n=5, cutoff=0.4)
        close += [k for k in known if id and (id in k or k.split("/")[0] == id) and k not in close][: 5 - len(close)]
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        broken = f" Plugins that failed to load: {self.plugin_errors}." if self.plugin_errors else ""
        raise UnknownIdError(
            f"unknown {self.kind} id {id!r}.{hint} `agentgym-opd {self.kind}s` lists all {len(known)} registered ids.{broken}"
            f" An {self.kind} added through a new entry point (a line under [project.entry-points.\"{self.group}\"]) "
            "is seen only once its package is reinstalled: `pip install -e .` in that package."
        )

    def list(self) -> list[Spec]:
        self.discover()
        return [self._specs[k] for k in sorted(self._specs)]

    def ids(self) -> list[str]:
        return [s.id for s in self.list()]

    def make(self, id: str, **overrides: Any) -> Any:
        spec = self.spec(id)
        factory = load_entry_point(spec.entry_point)
        kwargs = {**spec.defaults, **overrides}
        try:
            return factory(**kwargs)
        except TypeError as err:
            if "unexpected keyword argument" not in str(err):
                raise
            if "'env_id'" in str(err) and "env_id" not in spec.defaults:
                raise BadArgumentsError(
                    f"{self.kind} {id!r} rejected the argument env_id ({err}). The registry passes env_id={id!r} to "
                    "every env it makes (the id a record names): give the class's __init__ `**kwargs` and pass them "
                    "on to TextEnv.__init__, which takes env_id") from err
            raise BadArgumentsError(f"{self.kind} {id!r} rejected its arguments ({err}); it accepts: "
                                    f"{accepted_arguments(factory)}. Drop or rename the argument "
                                    f"(e.g. the --env-arg)") from err

    def __contains__(self, id: str) -> bool:
        self.discover()
        return id in self._specs


class EnvRegistry(Registry):
    def _on_register(self, spec: Spec) -> None:
        # Mirror into gymnasium's registry so its tooling (gymnasium.make, pprint_registry) sees our envs.
        if spec.id in gymnasium.registry:
            del gymnasium.registry[spec.id]  # re-registration (override=True) replaces, without gymnasium's warning
        gymnasium.register(id=spec.id, entry_point=spec.entry_point, kwargs={"env_id": spec.id, **spec.defaults})

    def make(self, id: str, **overrides: Any) -> Any:
        from agentgym_opd.mixture import is_mixture_id, make_mixture

        if is_mixture_id(id):  # "a+b": several registered envs as one (agentgym_opd.mixture)
            return make_mixture(id, **overrides)
        env = super().make(id, **{"env_id": id, **overrides})
        gym_spec = gymnasium.spec(id)
        env.spec = dataclasses.replace(gym_spec, kwargs={**gym_spec.kwargs, **overrides})
        return env


    def protocol(self, id: str, *, action_parser: str | None = None, system_prompt: str | None = None) -> EnvProtocol:
        """The env's registered parser and prompt, each replaced by the caller's when given ("" = no prompt)."""
        from agentgym_opd.mixture import is_mixture_id, mixture_protocol

        if is_mixture_id(id):
            return mixture_protocol(id, action_parser=action_parser, system_prompt=system_prompt)
        spec = self.spec(id)
        prompt = system_prompt
        if prompt is None:
            prompt = spec.system_prompt() if callable(spec.system_prompt) else spec.system_prompt
        return EnvProtocol(action_parser or spec.action_parser, prompt or None)


env_registry = EnvRegistry("env", ENV_GROUP)
algorithm_registry = Registry("algorithm", ALGO_GROUP)

register = env_registry.register
make = env_registry.make
register_algorithm = algorithm_registry.register
make_algorithm = algorithm_registry.make


def env_protocol(id: str, *, action_parser: str | None = None, system_prompt: str | None = None) -> EnvProtocol:
    return env_registry.protocol(id, action_parser=action_parser, system_prompt=system_prompt)


def env_instance_memory(id: str) -> int:
    """Bytes one instance of the env holds outside this process's Python heap (``process_memory_bytes`` of its
    class: a JVM child for ScienceWorld and TextWorldExpress), 0 when it declares none or is a factory function.
    Batch sizing counts it per row: 23 ScienceWorld games side by side started 23 JVMs, 12 GB."""
    factory = load_entry_point(env_registry.spec(id).entry_point)
    return int(getattr(factory, "process_memory_bytes", 0) or 0)


def list_envs() -> list[Spec]:
    return env_registry.list()


def list_algorithms() -> list[Spec]:
    return algorithm_registry.list()

"""`RayVectorTextEnv`: the `VectorTextEnv` interface, with every env in its own Ray actor.

Why actors: a JVM-backed env (ScienceWorld, ALFWorld's TextWorld) is slow, stateful, not picklable and
sometimes dies. One env per actor spreads the step cost over cores and machines (a Ray cluster), and an
actor that dies takes only its own episode with it.

Fault semantics (the contract a rollout loop relies on):

* **Exactly one terminal result per started episode.** If the actor running env i dies during `step`
  (the process was killed, the node went away: Ray's `RayActorError`), the result for env i in *that*
  `step` call is a `StepResult` with `truncated=True`, `terminated=False`, reward 0 and
  `info["error"] = StepError("env_crash", ...)`, `info["env_crashed"] = True` and `info["task"]` (the task
  that was running). The slot is then not running (pass None for it, like any finished env); a fresh actor
  is started in its place, ready for the next `reset`/`reset_at`. No later call reports that episode again.
* A step that does not answer within `step_timeout_s` (a hung backend) is handled the same way, with a
  `timeout` StepError and `info["env_timed_out"] = True`; the stuck actor is killed first.
* **Resets are retried.** An actor that dies during `reset` had no episode yet, so the reset is repeated
  on a fresh actor, up to `reset_retries` times, then a `RuntimeError` says which env keeps dying.
* **An env that raises while handling an action** (a bug that agent text hit) ends that episode as an
  `env_crash` result built inside the actor, exactly as the in-process stepper does (`vector.crash_result`):
  the actor lives on, is not restarted, and the other envs' steps go on.
* **Caller misuse still raises** (`EnvMisuseError`, an unknown task id on reset): the
  exception raised inside the actor is re-raised here as an instance of its own type, after every other
  env's step of that call has been applied (as with the in-process stepper, whose results are then lost).
* Bad agent output never reaches this layer as an exception: the env turns it into a StepError, and it
  comes back through Ray unchanged.

`restarts[i]` counts the replacements of slot i and `crash_log` records each one (slot, phase, task id,
turn, message), so a run can report how often its backends died.
"""

from __future__ import annotations

import os
import traceback
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from agentgym_opd.core import EnvMisuseError, TextEnv
from agentgym_opd.executors.env_spec import EnvSpec
from agentgym_opd.types import StepError, Task
from agentgym_opd.vector import StepResult, crash_result


class RemoteTraceback(Exception):
    """The traceback of an exception raised inside an env actor, chained as the re-raised error's cause."""


class _Raised:
    """An exception caught in the actor, shipped as (class, args, traceback text).

    Why not let Ray ship it: Ray re-creates remote exceptions by calling their class, which fails for
    exceptions with a custom `__init__` signature (e.g. `UnknownTaskError(task_id, known)`), turning a clear
    misuse error into Ray's `UnserializableException`. Rebuilding with `cls.__new__(cls, *args)` keeps the
    type and the message without calling `__init__`.
    """

    def __init__(self, exc: BaseException):
        self.cls = type(exc)
        self.args = exc.args
        self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))

    def reraise(self) -> None:
        try:
            exc = self.cls.__new__(self.cls, *self.args)
            exc.args = self.args
        except Exception:  # noqa: BLE001 - an exotic exception type: keep at least its text
            exc = RuntimeError(f"{self.cls.__name__}: {self.args}")
        raise exc from RemoteTraceback("raised inside the env actor:\n" + self.traceback)


def _unwrap(value: Any) -> Any:
    if isinstance(value, _Raised):
        value.reraise()
    return value


class EnvWorker:
    """What runs inside one actor: a single env built from its spec. Plain class; `ray.remote` wraps it."""

    def __init__(self, spec: EnvSpec):
        self.env = spec.build()

    def reset(self, seed: int | None, options: dict[str, Any] | None):
        try:
            return self.env.reset(seed=seed, options=options)
        except Exception as exc:  # noqa: BLE001 - shipped to the caller and re-raised there
            return _Raised(exc)

    def step(self, action: Any):
        try:
            return self.env.step(action)
        except EnvMisuseError as exc:  # the caller's bug: shipped to the caller and re-raised there
            return _Raised(exc)
        except Exception as exc:  # noqa: BLE001 - the env failed on this action: the episode ends, as in-process
            r = crash_result(self.env, exc)
            return r.observation, r.reward, r.terminated, r.truncated, r.info

    def task_ids(self) -> list[str]:
        return self.env.task_ids()

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.env.close()


_REMOTE_WORKER = None


def _remote_worker_class():
    """`ray.remote(EnvWorker)`, made once; `max_restarts=0` because restarts are ours (a fresh env, reported)."""
    global _REMOTE_WORKER
    if _REMOTE_WORKER is None:
        _REMOTE_WORKER = ray.remote(max_restarts=0)(EnvWorker)
    return _REMOTE_WORKER


class RayVectorTextEnv:
    """N envs in N Ray actors; `reset`/`step` behave as `VectorTextEnv`'s (see the module docstring for faults).

    `actor_options` go to `.options(...)` of each actor (default `num_cpus=1`: one core per env, which is what
    a JVM env needs; use a fraction to pack microsecond envs). Ray is initialised with defaults if the caller
    has not done so (`ray.init(address="auto")` first to use an existing cluster).
    """

    def __init__(
        self,
        specs: Sequence[EnvSpec],
        *,
        actor_options: dict[str, Any] | None = None,
        step_timeout_s: float | None = None,
        reset_retries: int = 2,
    ):
        if not specs:
            raise ValueError("RayVectorTextEnv needs at least one env spec")
        if step_timeout_s is not None and step_timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be positive, got {step_timeout_s}")
        if reset_retries < 0:
            raise ValueError(f"reset_retries must be >= 0, got {reset_retries}")
        if not ray.is_initialized():
            ray.init()
        self.specs = list(specs)
        self.actor_options = {"num_cpus": 1, **(actor_options or {})}
        self.step_timeout_s = step_timeout_s
        self.reset_retries = reset_retries
        n = len(self.specs)
        self.actors = [self._start_actor(i) for i in range(n)]
        self.active = [False] * n
        self.restarts = [0] * n
        self.crash_log: list[dict[str, Any]] = []
        self._tasks: list[Task | None] = [None] * n
        self._turns = [0] * n
        self._last_progress: list[tuple[bool, float]] = [(False, 0.0)] * n
        self._closed = False

    # ----------------------------------------------------------------- constructors
    @classmethod
    def make(cls, env_id: str, num_envs: int, *, actor_options: dict[str, Any] | None = None,
             step_timeout_s: float | None = None, reset_retries: int = 2, **env_kwargs: Any) -> "RayVectorTextEnv":
        """`num_envs` actors, each running `agentgym_opd.make(env_id, **env_kwargs)`."""
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        specs = [EnvSpec(env_id=env_id, kwargs=dict(env_kwargs)) for _ in range(num_envs)]
        return cls(specs, actor_options=actor_options, step_timeout_s=step_timeout_s, reset_retries=reset_retries)

    @classmethod
    def from_env_fns(cls, env_fns: Sequence[Callable[[], TextEnv]], **kwargs: Any) -> "RayVectorTextEnv":
        """One actor per picklable factory (a class, a `functools.partial`, a module-level function)."""
        return cls([EnvSpec(env_fn=fn) for fn in env_fns], **kwargs)

    # ----------------------------------------------------------------- VectorTextEnv interface
    @property
    def num_envs(self) -> int:
        return len(self.specs)

    def reset(
        self,
        seeds: Sequence[int | None] | None = None,
        options: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[tuple[str, dict[str, Any]]]:
        return self.reset_at(range(self.num_envs), seeds, options)

    def reset_at(
        self,
        indices: Sequence[int],
        seeds: Sequence[int | None] | None = None,
        options: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[tuple[str, dict[str, Any]]]:
        """Reset only the envs in `indices` (in parallel), leaving the others' episodes running.

        Rollout loops need this: envs finish at different turns and each free slot takes the next task.
        """
        self._check_open()
        indices = list(indices)
        seeds = list(seeds) if seeds is not None else [None] * len(indices)
        options = list(options) if options is not None else [None] * len(indices)
        if len(seeds) != len(indices) or len(options) != len(indices):
            raise ValueError(
                f"reset needs {len(indices)} seeds and {len(indices)} options, got {len(seeds)} and {len(options)}"
            )
        for i in indices:
            self._check_index(i)
        if len(set(indices)) != len(indices):
            raise ValueError(f"reset_at got a repeated env index: {indices}")
        out: dict[int, tuple[str, dict[str, Any]]] = {}
        pending = list(zip(indices, seeds, options))
        failures: dict[int, int] = {}
        while pending:
            refs = [(i, s, o, self.actors[i].reset.remote(s, o)) for i, s, o in pending]
            pending = []
            for i, s, o, ref in refs:
                try:
                    out[i] = _unwrap(ray.get(ref))
                except RayActorError as exc:
                    failures[i] = failures.get(i, 0) + 1
                    self._replace(i, phase="reset", message=_short(exc))
                    if failures[i] > self.reset_retries:
                        raise RuntimeError(
                            f"env worker {i} ({self.specs[i].describe()}) died during reset {failures[i]} times "
                            f"in a row; the last error: {_short(exc)}"
                        ) from exc
                    pending.append((i, s, o))
        for i in indices:
            obs, info = out[i]
            self.active[i] = True
            self._tasks[i] = info.get("task")
            self._turns[i] = 0
            self._last_progress[i] = (bool(info.get("success", False)), float(info.get("score", 0.0)))
        return [out[i] for i in indices]

    def step(self, actions: Sequence[str | None]) -> list[StepResult | None]:
        """Step env i with actions[i] (all in parallel); None skips it. A dead actor yields an env_crash result."""
        self._check_open()
        if len(actions) != self.num_envs:
            raise ValueError(f"step needs {self.num_envs} actions (None to skip an env), got {len(actions)}")
        for i, action in enumerate(actions):
            if action is not None and not self.active[i]:
                raise RuntimeError(f"env {i} is not running (finished, crashed or never reset); pass None for it")
        refs = {i: self.actors[i].step.remote(a) for i, a in enumerate(actions) if a is not None}
        timed_out: set[int] = set()
        if self.step_timeout_s is not None and refs:
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.step_timeout_s)
            ready_set = set(ready)
            timed_out = {i for i, ref in refs.items() if ref not in ready_set}
        results: list[StepResult | None] = [None] * self.num_envs
        misuse: Exception | None = None
        for i, ref in refs.items():
            self._turns[i] += 1
            if i in timed_out:
                message = (f"The environment did not answer within {self.step_timeout_s:g} s and was restarted; "
                           "this episode has ended.")
                # actor tasks cannot be force-cancelled: _lost_episode kills the stuck actor instead
                results[i] = self._lost_episode(i, StepError("timeout", message), flag="env_timed_out")
                continue
            try:
                res = StepResult(*_unwrap(ray.get(ref)))
            except (RayActorError, GetTimeoutError) as exc:
                message = ("The environment's backend crashed and was restarted; this episode has ended. "
                           f"({_short(exc)})")
                results[i] = self._lost_episode(i, StepError("env_crash", message), flag="env_crashed")
                continue
            except Exception as exc:  # noqa: BLE001 - misuse inside the env: raised after the others are in
                self._turns[i] -= 1
                misuse = misuse or exc
                continue
            self._last_progress[i] = (bool(res.info.get("success", False)), float(res.info.get("score", 0.0)))
            if res.done:
                self.active[i] = False
            results[i] = res
        if misuse is not None:
            raise misuse
        return results

    def close(self) -> None:
        """Stop every actor (idempotent). Envs are closed politely first, with a short grace period."""
        if self._closed:
            return
        self._closed = True
        closing = [a.close.remote() for a in self.actors]
        try:
            ray.wait(closing, num_returns=len(closing), timeout=5.0)
        except Exception:  # noqa: BLE001 - a dead actor cannot close; it is killed below either way
            pass
        for actor in self.actors:
            _kill_quietly(actor)

    def __enter__(self) -> "RayVectorTextEnv":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ----------------------------------------------------------------- introspection (tests, monitoring)
    def pids(self) -> list[int]:
        """The OS process id of each env's actor (to watch, or to kill it in a fault-injection test)."""
        return ray.get([a.pid.remote() for a in self.actors])

    def task_ids(self) -> list[str]:
        return ray.get(self.actors[0].task_ids.remote())

    # ----------------------------------------------------------------- internals
    def _start_actor(self, i: int):
        return _remote_worker_class().options(**self.actor_options).remote(self.specs[i])

    def _replace(self, i: int, *, phase: str, message: str) -> None:
        task = self._tasks[i]
        self.crash_log.append({
            "env_index": i, "phase": phase, "task_id": task.id if (task is not None and phase == "step") else None,
            "turn": self._turns[i] if phase == "step" else 0, "message": message,
        })
        _kill_quietly(self.actors[i])
        self.actors[i] = self._start_actor(i)
        self.restarts[i] += 1
        self.active[i] = False

    def _lost_episode(self, i: int, error: StepError, *, flag: str) -> StepResult:
        """The one terminal result of an episode whose actor died or hung; the slot gets a fresh actor."""
        task = self._tasks[i]
        turn = self._turns[i]
        self._replace(i, phase="step", message=error.message)
        success, score = self._last_progress[i]
        info = {
            "turn": turn, "error": error, "feedback": error.message, "success": success, "score": score,
            "admissible_actions": None, "task": task, flag: True,
        }
        return StepResult(error.message, 0.0, False, True, info)

    def _check_index(self, i: int) -> None:
        if not 0 <= i < self.num_envs:
            raise IndexError(f"env index {i} out of range for {self.num_envs} envs")

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this RayVectorTextEnv is closed")


def _kill_quietly(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already dead or its node is gone: nothing left to stop
        pass


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."

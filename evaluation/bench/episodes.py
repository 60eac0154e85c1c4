"""Evaluation inside a bench: greedy episodes of one policy on one env split, and which tasks each seed plays.

The trainer's own evaluation, the reference rows and the published `eval --bench-tasks` rows all play the
tasks chosen here, so a bench cell and a published row compare task for task.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from evaluation.bench.settings import BenchSettings


def evaluate_policy(policy: Any, env_id: str, settings: BenchSettings, *, env_args: dict[str, Any],
                    tasks: list[str] | None = None, with_context: bool = False,
                    progress_file: Path | None = None) -> tuple[list[Any], float]:
    """Greedy episodes on a fixed subset of the split's tasks; (episodes, wall seconds).

    The engine is built like the trainer's evaluation engine (same system prompt, action parser, greedy
    sampling), and the training env is scored on the trainer's own eval tasks (its first
    ``eval_episodes``), so the ``train`` row, the curve's point 0 and a training-time ``eval/success``
    mean the same thing. Other splits: the runner's evenly spaced subset, spread over task types.
    ``tasks`` (default: ``eval_task_ids`` of the first seed) chooses them explicitly; ``with_context`` shows
    each task's privileged context after the first observation, as a self-teacher sees it. ``progress_file``:
    rewritten with ``done/total`` as each game ends (`jobs.eval_progress` reads it for the bench's bar) and
    removed when the split is played.
    """
    from agentgym_opd.playing import play_tasks
    from agentgym_opd.policy.base import SamplingParams
    from agentgym_opd.registry import env_protocol

    started = time.perf_counter()
    if tasks is None:
        tasks = eval_task_ids(env_id, settings, settings.seeds[0])
    overrides = {"max_turns": settings.max_turns, **env_args}
    contexts = None
    if with_context:
        probe = make_env(env_id, settings, env_args)
        contexts = privileged_contexts(probe, tasks)
        probe.close()
    from evaluation.records import BENCH_CONTEXT_TOKENS

    protocol = env_protocol(env_id)  # what the trainer uses too (the family's default parser and prompt)
    episodes = play_tasks(policy, env_id, tasks, sampling=SamplingParams(max_new_tokens=settings.max_new_tokens,
                                                                         temperature=0.0),
                          action_parser=protocol.action_parser, system_prompt=protocol.system_prompt,
                          seed=settings.eval_seed, batch_size=min(len(tasks), settings.eval_batch or len(tasks)),
                          max_context_tokens=BENCH_CONTEXT_TOKENS, env_kwargs=overrides, contexts=contexts,
                          on_episode=_progress_writer(progress_file, len(tasks)))
    if progress_file is not None:  # the split is played: its records and parts say the rest
        progress_file.unlink(missing_ok=True)
    return episodes, time.perf_counter() - started


def _progress_writer(path: Path | None, total: int) -> Any:
    """An ``on_episode`` callback writing ``done/total`` to ``path`` (None: no callback)."""
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    ended = [0]

    def wrote(index: int, episode: Any) -> None:
        ended[0] += 1
        path.write_text(f"{ended[0]}/{total}", encoding="utf-8")

    path.write_text(f"0/{total}", encoding="utf-8")
    return wrote


def privileged_contexts(env: Any, tasks: list[str]) -> list[str | None]:
    """Each task's privileged context as the ``warm_start+context`` row shows it after the first observation."""
    from agentgym_opd.distill import privileged_text

    return [privileged_text(env.get_task(t)) for t in tasks]


def make_env(env_id: str, settings: BenchSettings, env_args: dict[str, Any]) -> Any:
    from agentgym_opd.registry import make

    return make(env_id, **{"max_turns": settings.max_turns, **env_args})


def evaluate_every_seed(policy: Any, env_id: str, settings: BenchSettings, *, with_context: bool = False,
                        progress_file: Path | None = None) -> tuple[dict[int, list[str]], dict[str, Any], float]:
    """Every seed's tasks played greedily once: (task ids per seed, episode per task id, wall seconds). Greedy
    decoding has no seed, so one evaluation of the union of the seeds' tasks serves them all."""
    by_seed = {seed: eval_task_ids(env_id, settings, seed) for seed in settings.seeds}
    tasks = list(dict.fromkeys(t for ids in by_seed.values() for t in ids))  # seeds 16 apart share tasks
    episodes, wall = evaluate_policy(policy, env_id, settings, env_args=eval_env_args(env_id, settings), tasks=tasks,
                                     with_context=with_context, progress_file=progress_file)
    return by_seed, {e.task.id: e for e in episodes}, wall


def eval_task_ids(env_id: str, settings: BenchSettings, seed: int) -> list[str]:
    """The tasks a seed is evaluated on: the training env's first ``train_eval_episodes`` (the trainer's own
    eval tasks); on other splits ``eval_episodes`` tasks spread evenly over the seed's share of the split
    (household: seed s takes the (s mod 16)-th block of ``eval_episodes`` consecutive tasks, which cycle
    through the six task types, so different seeds add different held-out tasks and a seed's tasks do not
    depend on which other seeds run; other families: the same evenly spaced subset for every seed)."""
    from evaluation.runner import bench_task_ids

    ids = make_env(env_id, settings, eval_env_args(env_id, settings)).task_ids()
    if env_id == settings.env:
        return ids[: settings.train_eval_episodes]
    return bench_task_ids(env_id, ids, seed, settings.eval_episodes)


def curve_task_ids(settings: BenchSettings) -> list[str]:
    """The tasks of a curve point: the curve env's first ``curve_episodes``, as the trainer's evaluation plays them."""
    from evaluation.bench.settings import resolved_curve_env

    curve_env = resolved_curve_env(settings)
    return make_env(curve_env, settings, eval_env_args(curve_env, settings)).task_ids()[: settings.curve_episodes]


def curve_success(settings: BenchSettings, outcomes: dict[tuple[int, str], float]) -> float:
    """Success on the curve's tasks from one row's outcomes on the curve env (greedy: one value per task)."""
    by_task = {task: value for (_seed, task), value in outcomes.items()}
    tasks = curve_task_ids(settings)
    return sum(by_task[t] for t in tasks) / len(tasks)


def curve_start(policy: Any, settings: BenchSettings, outcomes: dict[str, dict[tuple[int, str], float]]) -> float:
    """The curve's point 0: the warm start's success at the curve's tasks, read off its evaluation of the curve env
    (``outcomes`` per env id) where that played them (`settings.curve_from_evaluations`), else played here."""
    from evaluation.bench.settings import curve_from_evaluations, resolved_curve_env

    curve_env = resolved_curve_env(settings)
    if curve_from_evaluations(settings):
        return curve_success(settings, outcomes[curve_env])
    episodes, _ = evaluate_policy(policy, curve_env, settings, env_args=eval_env_args(curve_env, settings),
                                  tasks=curve_task_ids(settings))
    return sum(e.success for e in episodes) / len(episodes)


def eval_env_args(env_id: str, settings: BenchSettings) -> dict[str, Any]:
    """The training env keeps its constructor options (its task subset); other splits get their own tasks,
    enough of them (household generates any number) that every seed has ``eval_episodes`` of its own."""
    if env_id == settings.env:
        return settings.resolved_env_args()
    if env_id.startswith("household/"):
        from evaluation.runner import bench_split_args

        return {**bench_split_args(env_id, settings.seeds, settings.eval_episodes), **settings.base_env_args()}
    return {}


def load_frozen_policy(path: str, settings: BenchSettings) -> Any:
    from agentgym_opd.config import load_config
    from agentgym_opd.policy.loading import load_student

    # the runs' precision settings (a track's bf16 autocast) apply to the frozen rows' evaluations too
    precision = [o for o in settings.overrides if o.split("=", 1)[0] in ("model.autocast", "model.dtype")]
    return load_student(path, load_config(None, [f"model.device={settings.device}", *precision]).model, trainable=False)

"""Evaluate a *model* policy (`tiny`, `smollm2`, a local HF folder, a trainer checkpoint or run) on an env split.

`agentgym-opd eval --policy NAME --env ID` lands here when NAME is not a scripted agent; what NAME may be is
`agentgym_opd.policy.loading`'s table. The episodes are played by `agentgym_opd.playing.play_tasks`, the
same routine the trainer's evaluation and the bench use.

Protocol: the split's task ids in stable order (`runner.select_tasks`), K samples per task, greedy decoding
by default (K > 1 needs temperature > 0, else pass@k would repeat pass@1). The action parser and system
prompt are, in order: the flags, the checkpoint's own (`rollout.*` in its config.yaml, so a checkpoint is
judged under the protocol it trained with; checkpoints older than those keys used `text` and the
one-action prompt), the env family's registered default. Rollout k of seed s uses rollout seed
`s * 1_000_000 + k` whatever the batch size, so numbers do not depend on `num_envs` or the memory budget.

What a run leaves (with `--out rec.json`): the record, and beside it `rec.episodes.jsonl`, one line per
episode written as each episode ends (outcome, turns, errors, tokens; the first `transcripts` episodes
with their whole transcript). The record itself keeps three episode traces (failures first), which the
leaderboard shows turn by turn. An interrupted run (Ctrl-C) still writes a record of the episodes it
finished, marked `protocol.partial = true` so the leaderboard never pools it with complete runs.

Decisions: one record per seed (`rec.seed0.json`, ... for several); `wall_time_s` is the rollout time of
that seed (model loading excluded); max_turns / max_new_tokens default to the env's turn limit and 128
tokens, not a checkpoint's training values, so every algorithm is evaluated alike; a LoRA checkpoint is
merged into its base; `--executor ray` is for scripted agents only.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from tqdm import tqdm

from agentgym_opd.policy.loading import (DEFAULT_MAX_CONTEXT_TOKENS, PolicySetupError, PolicySource, load_policy,
                                         resolve_policy, vllm_available)
from agentgym_opd.registry import env_protocol, make
from agentgym_opd.types import Episode
from evaluation.records import env_args_label
from evaluation.runner import bench_split_args, bench_task_ids, episode_line, make_record, select_tasks

EvalSetupError = PolicySetupError  # bad evaluation input; the message says what to pass instead
__all__ = ["EvalSetupError", "PolicySource", "evaluate_policy", "load_policy", "resolve_policy", "vllm_available",
           "resolve_action_parser", "episodes_path"]

DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_K_VALUES = (1, 5, 10)
DEFAULT_MEMORY_BUDGET_GB = 2.0
KEPT_EPISODES = 3  # traces kept inside each record (the episode file beside it has them all)
_SEED_STRIDE = 1_000_000  # rollout seeds of different evaluation seeds never meet below a million rollouts
_LEGACY_PROTOCOL = ("text", "You are an agent in a text environment. Reply with exactly one action per turn.")


def resolve_action_parser(name: str) -> Any:
    """'text', 'json', 'code', 'tags' or a 'module:function' entry point taking (text, finish_reason)."""
    from agentgym_opd.action_parsing import get_parser

    try:
        return get_parser(name)
    except ValueError as err:
        raise EvalSetupError(f"--action-parser {name!r}: {err}") from err


def episodes_path(record_path: str | Path) -> Path:
    """`rec.json` -> `rec.episodes.jsonl`: the per-episode outcomes and transcripts beside a record."""
    path = Path(record_path)
    return path.with_name(f"{path.stem}.episodes.jsonl")


def _protocol_for(env_id: str, source: PolicySource, action_parser: str | None, system_prompt: str | None):
    """Flags, else the checkpoint's own protocol, else the env family's (see the module docstring)."""
    if source.checkpoint is not None:
        saved_parser = source.run_rollout.get("action_parser")
        saved_prompt = source.run_rollout.get("system_prompt")
        if saved_parser is None and saved_prompt is None:
            saved_parser, saved_prompt = _LEGACY_PROTOCOL
        action_parser = action_parser or saved_parser
        system_prompt = system_prompt if system_prompt is not None else saved_prompt
    return env_protocol(env_id, action_parser=action_parser, system_prompt=system_prompt)


def context_budget(source: PolicySource, max_context_tokens: int | None) -> int:
    """The tokens of history a model sees (older turns are cut first): the flag, else the run's
    ``max_seq_len``, else the default."""
    return max_context_tokens or int(source.run_model.get("max_seq_len") or DEFAULT_MAX_CONTEXT_TOKENS)


def record_protocol(env_id: str, source: PolicySource, *, temperature: float, top_p: float, samples: int,
                    max_new_tokens: int, max_turns: int | None, backend: str, action_parser: str | None,
                    system_prompt: str | None, env_args: dict[str, Any] | None = None,
                    max_context_tokens: int | None = None) -> dict[str, Any]:
    """The ``protocol`` field an evaluation with these settings writes, the parser and prompt resolved as the
    module docstring says, the context budget, and the env options (``--env-arg``) when there are any. One
    function for both, so `leaderboard stamp` compares a command with a record exactly as eval would have
    written it."""
    protocol = _protocol_for(env_id, source, action_parser, system_prompt)
    written = {"temperature": temperature, "top_p": top_p, "samples": samples, "max_new_tokens": max_new_tokens,
               "max_turns": max_turns, "backend": backend, "action_parser": protocol.action_parser,
               "system_prompt": protocol.system_prompt,
               "max_context_tokens": context_budget(source, max_context_tokens)}
    options = env_args_label(env_args)
    return {**written, "env_args": options} if options is not None else written


class EpisodeEta:
    """Time left in a run whose episodes play ``slots`` at a time, each taking a freed slot as soon as an
    earlier one ends (the rollout engine's continuous batching).

    Why not tqdm's ETA: it divides elapsed time by episodes done, as if episodes ran one after another. With
    100 episodes side by side the first one ends after a whole episode's latency (say 44 s of a 100 s run),
    and 99 x 44 s reads "1:12:44". Here the mean latency L of the finished episodes is the unit of work:
    a running episode of age a has L - a left; one older than L ("overdue": it outlived the finished ones,
    which are biased short) is guessed to have a x (the share of started episodes still running) left, which
    is long while most of its cohort runs and shrinks as the cohort ends; an episode not started yet needs
    L once it gets a slot. The run ends when the running ones end, or, with episodes still waiting, one L
    after the last of them starts, which is when the slots have worked off the earlier ones.
    Rollout k starts at time 0 when k < slots, else when the (k - slots + 1)-th episode ends (rollouts start
    in index order), which gives each finished episode's latency without the engine reporting it.
    `clock` is injectable (tests use a fake one); `seconds_left()` is None until an episode has ended."""

    def __init__(self, total: int, slots: int, clock: Callable[[], float] = time.perf_counter):
        self.total, self.slots, self.clock = total, max(1, min(slots, total)), clock
        self.started_at = clock()
        self.running: dict[int, float] = {k: self.started_at for k in range(self.slots)}  # index -> start
        self.latencies: list[float] = []

    def finished(self, index: int) -> None:
        """Episode ``index`` ended now: its latency is known and its slot goes to the next waiting one."""
        now = self.clock()
        start = self.running.pop(index, self.started_at)
        self.latencies.append(now - start)
        next_index = self.slots + len(self.latencies) - 1
        if next_index < self.total:
            self.running[next_index] = now

    def seconds_left(self) -> float | None:
        if not self.latencies:
            return None
        now = self.clock()
        mean = sum(self.latencies) / len(self.latencies)
        started = len(self.latencies) + len(self.running)
        still_running = len(self.running) / started
        left = sorted(mean - age if age < mean else age * still_running
                      for age in (now - start for start in self.running.values()))
        waiting = self.total - started
        if waiting == 0:
            return max(left, default=0.0)
        if waiting <= len(left):  # the last waiting episode takes the waiting-th slot to free up
            last_start = left[waiting - 1]
        else:  # the slots work off what runs and all but one slot-full of the waiting ones first
            last_start = (sum(left) + (waiting - len(left)) * mean) / max(len(left), 1)
        return max(max(left, default=0.0), last_start + mean)


class _Progress:
    """Episodes done / total with ETA (`EpisodeEta`), success so far and tokens/s on the bar, updated as each
    episode ends; each episode appended to the JSONL at once, so an interrupt loses only the episodes still
    running."""

    BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"

    def __init__(self, total: int, desc: str, enabled: bool, out: Path | None, transcripts: int, tokenizer: Any,
                 slots: int = 1, clock: Callable[[], float] = time.perf_counter):
        self.bar = tqdm(total=total, desc=desc, unit="ep", disable=not enabled, bar_format=self.BAR_FORMAT)
        self.out, self.transcripts, self.tokenizer = out, transcripts, tokenizer
        self.clock = clock
        self.started = clock()
        self.eta = EpisodeEta(total, slots, clock)
        self.finished: list[tuple[int, Episode]] = []
        self.agent_tokens = 0
        self.bar.set_postfix({"eta": "?"})

    def __call__(self, index: int, episode: Episode) -> None:
        if self.out is not None:
            with open(self.out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(episode_line(episode, index, transcript=index < self.transcripts,
                                                 tokenizer=self.tokenizer)) + "\n")
        self.finished.append((index, episode))
        self.eta.finished(index)
        self.agent_tokens += sum(len(t.action_token_ids) for t in episode.turns)
        self.bar.update(1)
        self.bar.set_postfix({"eta": self.eta_text(),
                              "success": f"{sum(e.success for _, e in self.finished) / len(self.finished):.2f}",
                              "tok/s": f"{self.tokens_per_s:.1f}"})

    def eta_text(self) -> str:
        left = self.eta.seconds_left()
        return "?" if left is None else tqdm.format_interval(left)

    @property
    def done(self) -> list[Episode]:
        """The finished episodes in task order (the order of a complete run, whatever order they ended in)."""
        return [e for _, e in sorted(self.finished, key=lambda pair: pair[0])]

    @property
    def tokens_per_s(self) -> float:
        return self.agent_tokens / max(self.clock() - self.started, 1e-9)


def kept_traces(episodes: Sequence[Episode], tokenizer: Any, limit: int = KEPT_EPISODES) -> list[dict[str, Any]]:
    """The episodes a record keeps for the leaderboard's episode view: failures first (where the policy goes
    wrong), then successes, each group in task order, at most ``limit``."""
    from evaluation.episode_trace import trace_episode

    chosen = [e for e in episodes if not e.success][:limit]
    chosen += [e for e in episodes if e.success][: limit - len(chosen)]
    return [trace_episode(e, tokenizer=tokenizer) for e in chosen]


def evaluate_policy(
    env_id: str,
    policy: str,
    *,
    episodes: int | None = None,
    seeds: Sequence[int] = (0,),
    samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    max_turns: int | None = None,
    max_context_tokens: int | None = None,
    action_parser: str | None = None,
    system_prompt: str | None = None,
    backend: str = "hf",
    device: str = "auto",
    dtype: str | None = None,
    num_envs: int | None = None,
    memory_budget_gb: float = DEFAULT_MEMORY_BUDGET_GB,
    progress: bool = True,
    out_paths: Sequence[Path] | None = None,
    transcripts: int = 10,
    bench_tasks: bool = False,
    **env_kwargs: Any,
) -> list[dict[str, Any]]:
    """Evaluate a model policy on `env_id` for each seed; one validated result record per seed.

    With `out_paths` (one per seed) the records and their episode files are written there as the run goes.
    With `bench_tasks` each seed plays the `episodes` tasks the bench gives that seed
    (:func:`evaluation.runner.bench_task_ids`), so its record compares with the bench's task for task;
    otherwise every seed plays the same evenly spread `episodes` tasks.
    Cheap checks (settings, env id, tasks, policy path, parser) run before the model is loaded."""
    from agentgym_opd.action_parsing import get_parser
    from agentgym_opd.playing import play_tasks, rows_for_memory
    from agentgym_opd.registry import env_instance_memory
    from agentgym_opd.policy.base import SamplingParams

    _check_settings(seeds=seeds, samples=samples, temperature=temperature, episodes=episodes, num_envs=num_envs,
                    memory_budget_gb=memory_budget_gb)
    if out_paths is not None and len(out_paths) != len(seeds):
        raise EvalSetupError(f"{len(out_paths)} output paths for {len(seeds)} seeds")
    if max_turns is not None:
        env_kwargs["max_turns"] = max_turns
    settings_env_args = dict(env_kwargs)  # what the protocol states; the split's size is not a setting
    env_kwargs = split_options(env_id, env_kwargs, seeds, episodes, bench_tasks)
    all_ids, split = _split_tasks(env_id, env_kwargs)
    tasks_of = {seed: seed_tasks(env_id, all_ids, seed, episodes, bench_tasks) for seed in seeds}
    source = resolve_policy(policy)
    settings = record_protocol(env_id, source, temperature=temperature, top_p=top_p, samples=samples,
                               max_new_tokens=max_new_tokens, max_turns=max_turns, backend=backend,
                               action_parser=action_parser, system_prompt=system_prompt, env_args=settings_env_args,
                               max_context_tokens=max_context_tokens)
    parser = resolve_action_parser(settings["action_parser"])
    context = settings["max_context_tokens"]
    try:
        sampling = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
    except ValueError as err:
        raise EvalSetupError(str(err)) from err
    if max_new_tokens >= context:
        raise EvalSetupError(f"--max-new-tokens {max_new_tokens} must be below the context budget {context} "
                             "(--max-context-tokens)")
    if not progress:  # --no-progress: no bar at all, Transformers' "Loading weights" included
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    model = load_policy(source, backend=backend, device=device, dtype=dtype, max_context_tokens=context, seed=seeds[0])
    batch_size = num_envs or rows_for_memory(model, context, int(memory_budget_gb * 2**30),
                                             env_bytes=env_instance_memory(env_id))
    k_values = tuple(sorted({*DEFAULT_K_VALUES, samples}))
    records = []
    for i, seed in enumerate(seeds):
        task_ids = tasks_of[seed]
        out = Path(out_paths[i]) if out_paths is not None else None
        lines = episodes_path(out) if out is not None else None
        if lines is not None:
            lines.parent.mkdir(parents=True, exist_ok=True)
            lines.write_text("")
        total = len(task_ids) * samples
        bar = _Progress(total, f"eval {env_id} seed {seed}", progress, lines, transcripts,
                        getattr(model, "tokenizer", None), slots=min(batch_size, total))
        started = time.perf_counter()
        interrupted = False
        try:
            play_tasks(model, env_id, task_ids, sampling=sampling, action_parser=parser,
                       system_prompt=settings["system_prompt"], samples=samples, seed=seed * _SEED_STRIDE,
                       batch_size=batch_size, max_context_tokens=context, env_kwargs=env_kwargs, on_episode=bar)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            bar.bar.close()
        if interrupted and not bar.done:
            raise KeyboardInterrupt(_kept_note(seeds[:i], out_paths, seed, None, 0))
        record = make_record(env_id, split, bar.done, algorithm=source.algorithm, student=source.student,
                             teacher=source.teacher, algorithm_config=source.algorithm_config, seed=seed,
                             wall_time_s=time.perf_counter() - started, k_values=k_values,
                             protocol={**settings, **({"partial": True} if interrupted else {})},
                             throughput={"agent_tokens": bar.agent_tokens, "tokens_per_s": round(bar.tokens_per_s, 2)})
        record["episodes"] = kept_traces(bar.done, getattr(model, "tokenizer", None))
        records.append(record)
        if out is not None:
            write_json_atomically(out, record)
        if interrupted:  # the partial record is written; stop here as the user asked
            raise KeyboardInterrupt(_kept_note(seeds[:i], out_paths, seed, out, len(bar.done)))
    return records


def write_json_atomically(path: Path, value: Any) -> None:
    """Write ``value`` as JSON through a temporary file and a rename, so a second Ctrl-C (or a kill) in the
    middle leaves the old file or the new one, never half a record."""
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


def _kept_note(done_seeds: Sequence[int], out_paths: Sequence[Path] | None, seed: int, partial: Path | None,
               finished: int) -> str:
    """What an interrupted evaluation leaves, for the one line the CLI prints: the records of the seeds that
    ended, and the interrupted seed's partial record (or why there is none)."""
    parts = []
    if done_seeds:
        where = (", ".join(str(out_paths[k]) for k in range(len(done_seeds))) if out_paths is not None
                 else "not written: no --out")
        parts.append(f"complete records of seed{'s' if len(done_seeds) > 1 else ''} "
                     f"{', '.join(map(str, done_seeds))}: {where}")
    if finished == 0:
        parts.append(f"seed {seed} stopped before any episode ended, so it has no record")
    elif partial is None:
        parts.append(f"seed {seed} stopped after {finished} episodes; its partial record is not written (no --out)")
    else:
        parts.append(f"seed {seed} stopped after {finished} episodes; its partial record (protocol.partial = "
                     f"true) is kept at {partial}, the episodes at {episodes_path(partial)}")
    return "; ".join(parts)
    return records


def _check_settings(*, seeds: Sequence[int], samples: int, temperature: float, episodes: int | None,
                    num_envs: int | None, memory_budget_gb: float) -> None:
    if not seeds:
        raise EvalSetupError("no seeds given: pass --seeds 0 (or several, e.g. --seeds 0 1 2)")
    if len(set(seeds)) != len(seeds):
        raise EvalSetupError(f"--seeds {list(seeds)} repeats a seed; each seed is one record")
    if samples < 1:
        raise EvalSetupError(f"--samples must be at least 1, got {samples}")
    if samples > 1 and temperature <= 0:
        raise EvalSetupError(f"--samples {samples} needs --temperature > 0 (e.g. 1.0): greedy decoding makes every "
                             "sample of a task identical, so pass@k would just repeat pass@1")
    if episodes is not None and episodes < 1:
        raise EvalSetupError(f"--episodes must be at least 1, got {episodes}")
    if num_envs is not None and num_envs < 1:
        raise EvalSetupError(f"--num-envs must be at least 1, got {num_envs}")
    if memory_budget_gb <= 0:
        raise EvalSetupError(f"--memory-budget-gb must be positive, got {memory_budget_gb}")


def _split_tasks(env_id: str, env_kwargs: dict[str, Any]) -> tuple[list[str], str]:
    """Every task id of the split, and the split's name."""
    probe = make(env_id, **env_kwargs)  # an unknown id raises UnknownIdError, which names close matches
    try:
        ids = probe.task_ids()
        split = probe.split
    finally:
        probe.close()
    if not ids:
        raise EvalSetupError(f"env {env_id} has no tasks to evaluate (check its data and constructor options)")
    return ids, split


def split_options(env_id: str, env_kwargs: dict[str, Any], seeds: Sequence[int], episodes: int | None,
                  bench_tasks: bool) -> dict[str, Any]:
    """The env's constructor options for these seeds: with ``bench_tasks``, a split long enough for every
    seed's block, as the bench sizes it (the caller's options win). One function for eval and `leaderboard
    stamp`, so both select from the same split."""
    if not (bench_tasks and episodes is not None):
        return env_kwargs
    return {**bench_split_args(env_id, seeds, episodes), **env_kwargs}


def seed_tasks(env_id: str, task_ids: list[str], seed: int, episodes: int | None, bench_tasks: bool) -> list[str]:
    """The tasks seed ``seed`` plays: the bench's for that seed (``bench_tasks``), else the evenly spread
    ``episodes`` (the same for every seed). One function for eval and for `leaderboard stamp`."""
    if not bench_tasks:
        return select_tasks(task_ids, episodes)
    if episodes is None:
        raise EvalSetupError("--bench-tasks needs --episodes N (the bench evaluates 100 tasks per seed)")
    try:
        return bench_task_ids(env_id, task_ids, seed, episodes)
    except ValueError as err:
        raise EvalSetupError(str(err)) from err

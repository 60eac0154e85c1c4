"""The real-LM base pair on ALFWorld: student and teacher both SmolLM2-135M-Instruct, fine-tuned once on train games.

The household pair (`base_models`) taught what a pair must be for the methods to have something to distil: a
student that acts sensibly and reads context in its prompt, a stronger teacher that knows what to do after a
student's kind of mistakes. This module builds that pair from a real instruction-tuned model:

* the data: ALFWorld's 300 train games (``train_tasks``), each played once by the observable expert
  (`environments.alfworld.expert`: it searches receptacles until it sees the object, from the observations
  alone) and along its walkthrough, recorded (`environments.alfworld.replay`) and cached, so the examples are
  made by replaying records through the bench's own `RolloutEngine` and chat template (token for token what
  rollouts will ask the model) without paying TextWorld again. ``examples_per_game`` episodes per game, each
  with its own draw of context (`base_data.choose_kind`): none (the expert's actions), the walkthrough as a
  numbered plan (the actions then follow it: copying a plan is what OPSD/VPD/LOPD teachers need), a successful
  sibling's actions or feedback on a failed attempt (SDPO's formats, `agentgym_opd.distill`);
* mistakes (the teacher's ``mistake_share``): invalid commands like a student's (one name of the expert's next
  command swapped for another of the room, or a number it lacks) before some expert actions, masked out of the
  loss: ALFWorld answers "Nothing happens." and the state is unchanged, so the expert's next action stays right;
* the schedule: the student stops partway through a longer cosine schedule (``schedule_steps``: its learning
  rate not yet decayed, so supervision on its own states can still move it), the teacher trains longer;
* the format: the env family's system prompt and text parser, one command per reply ended by the chat
  template's end-of-turn token (the stop token rollouts use), episodes over ``max_context_tokens`` left out;
* speed: forward and backward under bf16 autocast (``autocast``; float32 master weights) where the CPU has it;
* resumable: every ``checkpoint_every`` steps the weights, the optimiser and the step go to the build's folder
  (atomically); the data are saved before training and each step's batch is a function of (seed, step), so a
  build killed at any moment resumes from its last checkpoint to bit-identical weights;
* the cache: ``<cache>/bench-base/alfworld-<name>-<key>/model``, the key a hash of every setting
  (`AlfworldPairSpec.key`), like the household pair's; a progress bar with an ETA per phase.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

BUILD_VERSION = 1  # bump when the data or the recipe changes in a way the spec does not capture
EXPERT_VERSION = 1  # bump when the observable expert's choices change (the recorded games are keyed by it)
TRAIN_ENV = "alfworld/train"
RECORD_TURNS = 50  # the expert plays each train game up to this many turns when its games are recorded


@dataclass(frozen=True)
class AlfworldPairSpec:
    """Every setting an ALFWorld pair model depends on (its cache key), except ``checkpoint_every``."""

    name: str  # student / teacher
    base: str = "smollm2"  # a named model (`agentgym_opd.policy.loading`) or a local folder
    steps: int = 40
    batch_size: int = 8
    lr: float = 1e-4
    warmup_steps: int = 4
    schedule_steps: int | None = None  # the cosine schedule's length; None: steps
    train_tasks: int = 300  # the first N train games (sorted ids)
    examples_per_game: int = 2
    context_share: float = 0.5
    context_weights: tuple[float, float, float] = (0.6, 0.2, 0.2)  # walkthrough, sibling, feedback
    mistake_share: float = 0.0
    max_turns: int = 30  # a demonstration longer than the track's turn limit is left out
    max_context_tokens: int = 2048  # an example longer than the rollouts' context budget is left out
    decision_weight: float = 1.0
    autocast: str = "bfloat16"  # none / bfloat16 / float16: the build's forward and backward
    seed: int = 0
    version: int = BUILD_VERSION
    checkpoint_every: int = 5  # not in the key: where a build stops and resumes never changes its result

    def key(self) -> str:
        settings = dataclasses.asdict(self)
        del settings["checkpoint_every"]
        return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]

    def label(self) -> str:
        """How records name the model: base, env, role, steps (and the mistake share)."""
        base = Path(self.base).name if os.sep in self.base else self.base
        label = f"{base}-alfworld-{self.name}-{self.steps}steps"
        return label + (f"-mistakes{round(100 * self.mistake_share)}" if self.mistake_share else "")

    # the bench drives any pair through these (`base_models.ensure_base_model` and its kin hand over to them)
    history_model = None  # the household pair's DAgger option; this recipe has none

    def cached(self) -> Path | None:
        return cached_pair_model(self)

    def ensure(self, *, progress: bool = True, log: Callable[[str], None] = print,
               progress_file: Path | None = None) -> Path:
        return build_pair_model(self, progress=progress, log=log, progress_file=progress_file)

    def estimated_seconds(self) -> float:
        return estimated_build_seconds(self, recorded=games_path(self).is_file())


# The track's pair. The student: about one pass over two examples of each train game, stopped at a third of its
# schedule; the teacher: two and a half times as long, half of its plain episodes with a student's invalid
# commands in their history. Forecast on the 2-core machine (bf16, one thread each, side by side): see
# `estimated_build_seconds`; the budget for the build is 2 hours.
STUDENT_SPEC = AlfworldPairSpec("student", steps=40, schedule_steps=120, context_weights=(0.6, 0.2, 0.2))
TEACHER_SPEC = AlfworldPairSpec("teacher", steps=100, examples_per_game=3, context_weights=(0.5, 0.25, 0.25),
                                mistake_share=0.5)

# Measured on the 2-core machine (2026-12-07, the two builds side by side, one thread each): the student's 40 steps
# in 18.7 min and the teacher's last 40 in 15.9 min, 161-197 training tokens/s under bf16 autocast (fp32 about
# half); examples average 564 (student) and 589 (teacher) tokens; recording the 300 games took 6.3 min.
TOKENS_PER_SECOND = {"bfloat16": 170.0, "none": 85.0, "float16": 85.0}
TOKENS_PER_EXAMPLE = 580
RECORD_SECONDS_PER_GAME = 1.3  # two real plays of a game (the expert's and the walkthrough), once for all specs


def estimated_build_seconds(spec: AlfworldPairSpec, *, recorded: bool = False) -> float:
    """A forecast of one model's build on one core: recording the games (unless cached) and the steps."""
    train = spec.steps * spec.batch_size * TOKENS_PER_EXAMPLE / TOKENS_PER_SECOND.get(spec.autocast, 65.0)
    return (0.0 if recorded else spec.train_tasks * RECORD_SECONDS_PER_GAME) + train


class BuildProgress:
    """A build's progress for a parent process's bar (``progress_file``): "seconds done/seconds total" of the
    forecast, so the half hour of recording games moves the bar as the training steps do. No file: no-op."""

    def __init__(self, spec: AlfworldPairSpec, file: Path | None) -> None:
        self.file, self.spec = file, spec
        self.step_s = estimated_build_seconds(spec, recorded=True) / max(spec.steps, 1)
        self.recording_s = 0.0 if games_path(spec).is_file() else spec.train_tasks * RECORD_SECONDS_PER_GAME
        self.total_s = self.recording_s + spec.steps * self.step_s

    def write(self, done_s: float) -> None:
        if self.file is not None:
            self.file.write_text(f"{min(done_s, self.total_s):.0f}/{self.total_s:.0f}\n", encoding="utf-8")

    def recorded(self, games: int) -> None:
        self.write(games * RECORD_SECONDS_PER_GAME)

    def trained(self, steps: int) -> None:
        self.write(self.recording_s + steps * self.step_s)


# ---------------------------------------------------------------------------------------------- cache
def cache_root() -> Path:
    from agentgym_opd.policy.tiny import cache_dir

    return cache_dir() / "bench-base"


def pair_model_dir(spec: AlfworldPairSpec) -> Path:
    return cache_root() / f"alfworld-{spec.name}-{spec.key()}"


def cached_pair_model(spec: AlfworldPairSpec) -> Path | None:
    model = pair_model_dir(spec) / "model"
    return model if (model / "config.json").is_file() else None


@contextlib.contextmanager
def file_lock(path: Path, log: Callable[[str], None] | None = None) -> Iterator[None]:
    """An exclusive lock on ``path`` (another process building the same thing waits, then reuses its result)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log:
                log(f"waiting for another process that holds {path}")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------- recorded games
def train_task_ids(spec: AlfworldPairSpec, env: Any) -> list[str]:
    ids = env.task_ids()
    if spec.train_tasks > len(ids):
        raise ValueError(f"train_tasks={spec.train_tasks} but {TRAIN_ENV} has {len(ids)} games")
    return ids[: spec.train_tasks]


def games_path(spec: AlfworldPairSpec) -> Path:
    """Where the recorded train games of ``spec`` are cached: keyed by the expert's version, the number of games
    (the train split's first ``train_tasks``, sorted) and the folder they come from."""
    from agentgym_opd.data import resolve_data_path
    from environments.alfworld.env import DOWNLOAD_HINT, default_alfworld_dir

    split = resolve_data_path("alfworld/json_2.1.1/train", fallback=default_alfworld_dir("train"),
                              how_to_get=DOWNLOAD_HINT)
    key = hashlib.sha1(json.dumps([EXPERT_VERSION, RECORD_TURNS, spec.train_tasks, str(split.resolve())]).encode()
                       ).hexdigest()[:10]
    return cache_root() / f"alfworld-games-{key}.jsonl"


def recorded_train_games(spec: AlfworldPairSpec, *, progress: bool = True, log: Callable[[str], None] = print,
                         build_progress: BuildProgress | None = None) -> list[Any]:
    """The train games played by the observable expert and along their walkthroughs, recorded; cached
    (`games_path`, shared by every spec: student and teacher record once). Each game's
    ``privileged["demonstration"]`` is the expert's actions (empty where it failed within RECORD_TURNS)."""
    from tqdm import tqdm

    from agentgym_opd.registry import make
    from environments.alfworld.expert import play, train_prior
    from environments.alfworld.replay import RecordingEnv, load_games, save_games

    path = games_path(spec)
    with file_lock(path.with_suffix(".lock"), log):
        if path.is_file():
            return load_games(path)
        env = make(TRAIN_ENV, max_turns=RECORD_TURNS)
        ids = train_task_ids(spec, env)
        prior = train_prior(str(env.split_dir))
        recorder = RecordingEnv(env)
        log(f"recording {len(ids)} ALFWorld train games (the observable expert and the walkthrough; "
            f"~{len(ids) * RECORD_SECONDS_PER_GAME / 60:.0f} min once, cached in {path})")
        for done, task_id in enumerate(tqdm(ids, desc="recording ALFWorld games", unit="game", disable=not progress)):
            if build_progress is not None:
                build_progress.recorded(done)
            run = play(recorder, task_id, prior=prior, max_turns=RECORD_TURNS)
            game = recorder.games[task_id]
            game.privileged["demonstration"] = run.actions if run.success else []
            recorder.reset(options={"task_id": task_id})
            for action in game.privileged["walkthrough"]:
                _, _, terminated, truncated, step = recorder.step(action)
                if step["error"] is not None or terminated or truncated:
                    break
        env.close()
        save_games([recorder.games[t] for t in ids], path)
        return [recorder.games[t] for t in ids]


# ---------------------------------------------------------------------------------------------- examples
def state_admissible(game: Any, path: list[str]) -> list[str]:
    """The admissible commands the record kept for the state after the commands ``path``. The record is keyed by
    accepted commands only: a command ALFWorld rejected ("Nothing happens.", e.g. going to a shelf that shares
    the agent's spot; 6 of the 2,282 expert actions on the 300 train games) left the state as it was."""
    from environments.alfworld.env import normalise_command
    from environments.alfworld.replay import path_key

    accepted: list[str] = []
    for action in path:
        command = normalise_command(action) or action
        if path_key([*accepted, command]) in game.steps:
            accepted.append(command)
    return game.steps[path_key(accepted)].admissible if accepted else game.first_admissible


def invalid_variant(action: str, admissible: list[str], names: list[str], rng: random.Random) -> str | None:
    """``action`` with one of its names ("mug 2") swapped for another name of the room or a number it lacks, such
    that the state does not admit it (a student's kind of mistake), or None."""
    found = re.findall(r"[a-z]+ \d+", action)
    if not found:
        return None
    name = rng.choice(found)
    kind = name.rsplit(" ", 1)[0]
    pool = [n for n in names if n != name] + [f"{kind} {k}" for k in range(1, 9)]
    rng.shuffle(pool)
    allowed = set(admissible)
    return next((wrong for other in pool if (wrong := action.replace(name, other, 1)) not in allowed
                 and wrong != action), None)


def with_mistakes(game: Any, actions: list[str], rng: random.Random, max_turns: int, rate: float = 0.25
                  ) -> tuple[list[str], set[int]]:
    """The actions with invalid commands put before some of them (each with chance ``rate``, again after one),
    within ``max_turns``; returns the actions and the turns that are mistakes (masked out of the loss)."""
    from environments.alfworld.expert import listed_names

    names = sorted(set(listed_names(game.first_observation)) | {n for s in game.steps.values()
                                                                 for n in listed_names(s.observation)})
    out: list[str] = []
    mistakes: set[int] = set()
    slack = max_turns - len(actions)
    for i, action in enumerate(actions):
        while len(mistakes) < slack and rng.random() < rate:
            wrong = invalid_variant(action, state_admissible(game, actions[:i]), names, rng)
            if wrong is None:
                break
            mistakes.add(len(out))
            out.append(wrong)
        out.append(action)
    return out, mistakes


def rejected_turns(env: Any, task_id: str, actions: list[str]) -> set[int]:
    """The turns of ``actions`` the game refuses ("Nothing happens."), played on ``env`` (a `ReplayEnv`)."""
    env.reset(options={"task_id": task_id})
    refused = set()
    for turn, action in enumerate(actions):
        _, _, terminated, truncated, step = env.step(action)
        if step["error"] is not None:
            refused.add(turn)
        if terminated or truncated:
            break
    return refused


def training_examples(policy: Any, spec: AlfworldPairSpec, games: list[Any], *, progress: bool = False
                      ) -> tuple[list[tuple[list[int], list[int]]], dict[str, int]]:
    """(token ids, loss mask) examples from the recorded games, and counts of what went in and what was left out."""
    from tqdm import tqdm

    from environments.alfworld.replay import ReplayEnv
    from evaluation.bench.base_data import choose_kind, context_plan, scripted_example

    usable = [g for g in games if g.privileged.get("demonstration")]
    replay = ReplayEnv(usable, max_turns=spec.max_turns)
    rng = random.Random(f"alfworld-pair-data/{spec.seed}")
    mistake_rng = random.Random(f"alfworld-pair-mistakes/{spec.seed}")
    counts = {"games": len(games), "expert_failed": len(games) - len(usable), "too_long": 0, "too_many_tokens": 0}
    examples = []
    bar = tqdm(total=len(usable) * spec.examples_per_game, desc=f"examples for {spec.name}", unit="episode",
               disable=not progress)
    for game in usable:
        task = game.task()
        for _ in range(spec.examples_per_game):
            bar.update(1)
            kind = choose_kind(rng, spec.context_share, spec.context_weights)
            context, actions = context_plan(task, kind, replay, rng)
            if len(actions) > spec.max_turns:
                counts["too_long"] += 1
                continue
            mistakes: set[int] = set()
            if spec.mistake_share and kind != "walkthrough" and mistake_rng.random() < spec.mistake_share:
                actions, mistakes = with_mistakes(game, actions, mistake_rng, spec.max_turns)
            # every refused command carries no loss: the mistakes, and the expert's own "go to" of a receptacle
            # that shares its spot (it then examines it; what it learns is the reaction, not the refused try)
            masked = rejected_turns(replay, task.id, actions)
            example, episode = scripted_example(policy, replay, task.id, actions, masked, context)
            if not episode.success:
                raise RuntimeError(f"replayed episode of {task.id} ({kind}) did not succeed: the record is broken")
            if len(example[0]) > spec.max_context_tokens:
                counts["too_many_tokens"] += 1
                continue
            counts[kind] = counts.get(kind, 0) + 1
            counts["with_mistakes"] = counts.get("with_mistakes", 0) + bool(mistakes)
            examples.append(example)
    bar.close()
    if not examples:
        raise RuntimeError(f"no training examples for {spec.name}: {counts}")
    return examples, counts


# ---------------------------------------------------------------------------------------------- training
def batch_indices(step: int, n: int, spec: AlfworldPairSpec) -> list[int]:
    """The examples of ``step``'s batch: epoch after epoch of seeded permutations, a function of (seed, step)
    alone, so a resumed build draws exactly the batches the killed one would have."""
    out = []
    for k in range(step * spec.batch_size, (step + 1) * spec.batch_size):
        epoch, position = divmod(k, n)
        order = list(range(n))
        random.Random(f"alfworld-pair-batches/{spec.seed}/{epoch}").shuffle(order)
        out.append(order[position])
    return out


def load_base(spec: AlfworldPairSpec) -> tuple[Any, Any]:
    """The base model (float32 weights; autocast hooks per ``spec.autocast``) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym_opd.policy.loading import model_path
    from agentgym_opd.policy.precision import enable_autocast

    path = model_path(spec.base)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    enable_autocast(model, spec.autocast)
    return model, tokenizer


def save_checkpoint(model: Any, optimiser: Any, step: int, losses: list[float], folder: Path) -> None:
    """Weights, optimiser state, steps done and losses, written to a temporary file and renamed."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "checkpoint.pt.tmp"
    torch.save({"model": model.state_dict(), "optimiser": optimiser.state_dict(), "step": step, "losses": losses,
                "rng": torch.get_rng_state()}, tmp)
    os.replace(tmp, folder / "checkpoint.pt")


def train(model: Any, examples: list[tuple[list[int], list[int]]], spec: AlfworldPairSpec, folder: Path, *,
          progress: bool = True, build_progress: BuildProgress | None = None, stop_after: int | None = None,
          log: Callable[[str], None] = print) -> list[float]:
    """AdamW on next-token cross-entropy over the agent's tokens (`base_training.accumulate_batch_gradient`), the
    household pair's warm-up and cosine schedule, resumed from ``folder/checkpoint.pt`` if there is one.
    ``stop_after``: return after checkpointing that many steps (what a kill right after a checkpoint leaves)."""
    import torch
    from tqdm import tqdm

    from evaluation.bench.base_training import accumulate_batch_gradient, learning_rate

    torch.manual_seed(spec.seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)
    start, losses = 0, []
    checkpoint = folder / "checkpoint.pt"
    if checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        optimiser.load_state_dict(state["optimiser"])
        torch.set_rng_state(state["rng"])
        start, losses = int(state["step"]), list(state["losses"])
        log(f"resuming the {spec.name} build at step {start}/{spec.steps} from {checkpoint}")
    model.train()
    bar = tqdm(total=spec.steps, initial=start, desc=f"alfworld {spec.name}", unit="step", disable=not progress)
    for step in range(start, spec.steps):
        rows = [examples[i] for i in batch_indices(step, len(examples), spec)]
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(step, spec)
        optimiser.zero_grad(set_to_none=True)
        losses.append(accumulate_batch_gradient(model, rows, spec.decision_weight))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        done = step + 1
        if build_progress is not None:
            build_progress.trained(done)
        if done < spec.steps and (done % spec.checkpoint_every == 0 or done == stop_after):
            save_checkpoint(model, optimiser, done, losses, folder)
        if done == stop_after:
            break
    bar.close()
    model.eval()
    return losses


class BuildStopped(RuntimeError):
    """`build_pair_model(..., stop_after=N)` stopped after its checkpoint at step N (tests of resuming)."""


def build_pair_model(spec: AlfworldPairSpec, *, progress: bool = True, log: Callable[[str], None] = print,
                     progress_file: Path | None = None, stop_after: int | None = None) -> Path:
    """The spec's model folder: cached, or built (resuming a killed build of the same spec) into the cache."""
    cached = cached_pair_model(spec)
    if cached is not None:
        return cached
    final = pair_model_dir(spec)
    partial = final.with_name(final.name + ".partial")
    with file_lock(final.with_name(final.name + ".lock"), log):
        cached = cached_pair_model(spec)
        if cached is not None:  # another process finished it while this one waited
            return cached
        started = time.perf_counter()
        log(f"building the ALFWorld {spec.name} ({spec.base}, {spec.steps} steps x {spec.batch_size} episodes, "
            f"~{estimated_build_seconds(spec) / 60:.0f} min on one core) into {final}"
            + (" (resuming)" if (partial / "checkpoint.pt").is_file() else ""))
        model, tokenizer = load_base(spec)
        build_progress = BuildProgress(spec, progress_file)
        examples = _examples(spec, model, tokenizer, partial, progress=progress, log=log, build_progress=build_progress)
        losses = train(model, examples, spec, partial, progress=progress, build_progress=build_progress,
                       stop_after=stop_after, log=log)
        if len(losses) < spec.steps:
            raise BuildStopped(f"stopped after step {len(losses)} (checkpoint in {partial})")
        _finish(model, tokenizer, spec, partial, losses, time.perf_counter() - started)
        (partial / "checkpoint.pt").unlink(missing_ok=True)
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
    log(f"ALFWorld {spec.name} built in {(time.perf_counter() - started) / 60:.1f} min: {final / 'model'}")
    return final / "model"


def _examples(spec: AlfworldPairSpec, model: Any, tokenizer: Any, partial: Path, *, progress: bool,
              log: Callable[[str], None], build_progress: BuildProgress | None = None) -> list[tuple[list[int], list[int]]]:
    """The build's examples: read back from its folder when resuming, else made and saved before training."""
    from agentgym_opd.policy.hf import HFPolicy

    saved = partial / "examples.json"
    if saved.is_file():
        return [tuple(e) for e in json.loads(saved.read_text(encoding="utf-8"))["examples"]]
    games = recorded_train_games(spec, progress=progress, log=log, build_progress=build_progress)
    examples, counts = training_examples(HFPolicy(model, tokenizer), spec, games, progress=progress)
    mean = sum(len(e[0]) for e in examples) / len(examples)
    log(f"{spec.name}: {len(examples)} examples, mean {mean:.0f} tokens; {counts}")
    partial.mkdir(parents=True, exist_ok=True)
    tmp = saved.with_name(saved.name + ".tmp")
    tmp.write_text(json.dumps({"counts": counts, "examples": examples}), encoding="utf-8")
    os.replace(tmp, saved)
    return examples


def _finish(model: Any, tokenizer: Any, spec: AlfworldPairSpec, partial: Path, losses: list[float],
            wall: float) -> None:
    from agentgym_opd.policy.loading import MODEL_NAME_FILE

    out = partial / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / MODEL_NAME_FILE).write_text(json.dumps({"name": spec.label()}) + "\n", encoding="utf-8")
    (partial / "spec.json").write_text(json.dumps(dataclasses.asdict(spec), indent=2) + "\n", encoding="utf-8")
    (partial / "losses.json").write_text(json.dumps(losses) + "\n", encoding="utf-8")
    (partial / "build_time_s.txt").write_text(f"{wall:.1f}\n", encoding="utf-8")

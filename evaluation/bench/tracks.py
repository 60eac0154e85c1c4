"""Tracks: named bench presets, each one starting point (env, protocol, base pair, budget), ``bench --track NAME``.

A track answers one question a researcher asks of the methods, at a size that fits its budget. The bench's own
default (household, the tiny pair) needs no name; a track bundles what differs:

``smollm2-alfworld``: does method X beat OPD on a real LM agent on ALFWorld? Student and teacher both
SmolLM2-135M-Instruct fine-tuned on ALFWorld's train games (`alfworld_pair`: the observable expert's
demonstrations, a share with context, the student partway through its schedule, the teacher longer and on a
student's kind of mistakes; built once, cached, resumable). Every row (warm start, warm start + context,
teacher, and the methods) starts from that student, trains ``steps x episodes_per_step`` rollout episodes of
``alfworld/train`` and is evaluated greedily on every game of ``alfworld/valid_seen`` and
``alfworld/valid_unseen`` (the claims read the unseen split). All forwards run under bf16 autocast
(``model.autocast``), one torch thread per worker process, one worker per core. SFT clones the observable
expert's recorded demonstrations (the env's ``demonstrations`` option). By default the five methods the issue's
time budget names run (SFT, OPD, SAGE-OPD, OPSD, GRPO); ``--algos`` adds SDPO, VPD and LOPD. The track resumes
(``--resume`` is on): each finished job is kept under ``<out>/jobs`` and a rerun of the same command skips it.

Flags given with ``--track`` override the preset's values (``--eval-env alfworld/valid_unseen`` to evaluate
on the unseen games only, ``--steps``, ``--algos``, ...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from evaluation.bench.alfworld_pair import STUDENT_SPEC, TEACHER_SPEC, AlfworldPairSpec, games_path


@dataclass(frozen=True)
class Track:
    """One named starting point of the bench: its pair, its settings and what an episode costs there."""

    name: str
    question: str
    student: Any
    teacher: Any
    settings: dict[str, Any]  # BenchSettings field values
    default_algos: tuple[str, ...]
    # (evaluation episode, rollout episode incl. its share of the update) in seconds of one core: the forecast
    episode_seconds: tuple[float, float] = (10.0, 20.0)
    env_args: Any = None  # callable (track) -> training env options, made when the settings are
    overrides: tuple[str, ...] = field(default_factory=tuple)  # config overrides of every run
    # rollout episode seconds per algorithm, where it differs from ``episode_seconds[1]``
    rollout_seconds: dict[str, float] = field(default_factory=dict)
    # "warm_start" / "teacher" -> sha256 of the weight files (`weights_files_sha256`) of the pair the published
    # rows started from: a pair rebuilt at another code revision can end at other weights under the same cache key
    published_weights: dict[str, str] = field(default_factory=dict)


def alfworld_env_args(track: Track) -> dict[str, Any]:
    """The training env sees the recorded observable-expert demonstrations (what the SFT row clones)."""
    return {"demonstrations": str(games_path(track.student))}


SMOLLM2_ALFWORLD = Track(
    name="smollm2-alfworld",
    question="does method X beat OPD on a real LM agent (SmolLM2-135M) on ALFWorld?",
    student=STUDENT_SPEC,
    teacher=TEACHER_SPEC,
    # eval_batch: two workers each evaluating a split's 140 games at once held 12-14 GB apiece (swap needed on a
    # 24 GiB machine); 64 games side by side take ~2.5 GB less each
    settings=dict(env="alfworld/train", eval_envs=["alfworld/valid_seen", "alfworld/valid_unseen"], student="smollm2",
                  seeds=[0], steps=8, episodes_per_step=8, group_size=4, lr=3e-5, temperature=1.0, eval_points=1,
                  eval_episodes=140, eval_batch=64, train_eval_episodes=8, curve_episodes=16, max_turns=20,
                  max_new_tokens=24, threads=1, resume=True, output_dir="runs/bench-smollm2-alfworld"),
    default_algos=("sft", "opd", "sage_opd", "opsd", "grpo"),
    # the timed run at `7ccf296` (two workers, the machine otherwise idle, 114 min in all): an evaluation game 3.8 s
    # on average (1.9 s with the plan in the prompt, 4.1 s for a student that plays most of its 20 turns); a
    # rollout episode with its share of the update 12.3 s for OPD (OPSD 12.2), SFT 3.2, GRPO 8.0 (no teacher),
    # SAGE-OPD 23.5 (its judge)
    episode_seconds=(3.8, 12.3),
    rollout_seconds={"sft": 3.2, "grpo": 8.0, "sage_opd": 23.5},
    env_args=alfworld_env_args,
    overrides=("model.autocast=bfloat16", "model.max_seq_len=2048", "train.micro_batch_size=2"),
    published_weights={"warm_start": "0848e25a47b1ce25ee58fc6629d7c1a1489bcecdb0dc140b1218418b30bc61df",
                       "teacher": "bbdc374ec2879d0a7759beae76aa3fb14ad1d206bf4e3dd3c2afa28c06ca5f0c"},
)

TRACKS: dict[str, Track] = {SMOLLM2_ALFWORLD.name: SMOLLM2_ALFWORLD}


def get_track(name: str) -> Track:
    from evaluation.bench.settings import BenchError

    if name not in TRACKS:
        raise BenchError(f"unknown track {name!r}; tracks: {', '.join(sorted(TRACKS))}")
    return TRACKS[name]


def track_settings(name: str, *, quick: bool = False, **changes: Any) -> Any:
    """The `BenchSettings` of a track, ``changes`` (the caller's flags) on top of its preset. ``quick``: one step
    and a dozen episodes per split, to check the wiring (the pair is still the track's)."""
    from evaluation.bench.settings import BenchSettings

    track = get_track(name)
    values: dict[str, Any] = dict(track.settings)
    if quick:
        values.update(steps=1, eval_episodes=12, train_eval_episodes=2, curve_episodes=2)
    values["algos"] = list(track.default_algos)
    values["overrides"] = list(track.overrides)
    for key, value in changes.items():
        if key == "overrides":
            values["overrides"] = list(track.overrides) + list(value or [])
        elif value is not None:
            values[key] = value
    values["track"] = name
    settings = BenchSettings(**values)
    if settings.env_args is None and track.env_args is not None:
        settings.env_args = track.env_args(track)
    return settings


def pair_differences(track: Track, models: dict[str, Any]) -> list[str]:
    """A warning per model of ``models`` (role -> model folder) whose weights are not those the track's published
    rows started from: this folder's rows then compare with each other, not with the leaderboard's."""
    from agentgym_opd.run_provenance import weights_files_sha256

    lines = []
    for role, folder in models.items():
        expected = track.published_weights.get(role)
        here = weights_files_sha256(folder) if expected else None
        if expected and here != expected:
            lines.append(f"warning: this {role} ({folder}) has other weights than the one the published "
                         f"{track.name} rows started from (sha256 {str(here)[:12]}, published {expected[:12]}; a build "
                         "at another code revision can end elsewhere): compare rows within this output folder, "
                         "not with the leaderboard's")
    return lines


def register_track(track: Track) -> Track:
    """Add (or replace) a track by name: a plugin's or a test's own preset."""
    TRACKS[track.name] = track
    return track


def tiny_alfworld_track(name: str = "tiny-alfworld", *, train_tasks: int = 2, **settings: Any) -> Track:
    """The smollm2-alfworld track at toy size on the tiny model (tests of the wiring): a pair of 2-step builds on
    ``train_tasks`` games, two evaluation games per split, one update step."""
    student = dataclasses.replace(STUDENT_SPEC, base="tiny", steps=2, schedule_steps=4, batch_size=2, warmup_steps=1,
                                  train_tasks=train_tasks, autocast="none")
    teacher: AlfworldPairSpec = dataclasses.replace(TEACHER_SPEC, base="tiny", steps=2, batch_size=2, warmup_steps=1,
                                                    train_tasks=train_tasks, autocast="none")
    preset = {**SMOLLM2_ALFWORLD.settings, "student": "tiny", "steps": 1, "episodes_per_step": 2, "group_size": 2,
              "eval_episodes": 2, "train_eval_episodes": 1, "curve_episodes": 1, "max_turns": 3,
              "max_new_tokens": 8, **settings}
    return Track(name, "wiring test", student, teacher, preset, ("opd",), (1.0, 1.0), alfworld_env_args,
                 ("model.max_seq_len=1024", "train.micro_batch_size=2"))

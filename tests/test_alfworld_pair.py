"""The SmolLM2 ALFWorld pair's recipe (`evaluation.bench.alfworld_pair`), end to end on the tiny model.

Recorded games must replay exactly as ALFWorld plays them (token for token through the rollout engine), the
data must hold what the recipe says (contexts, masked mistakes), and a build must be resumable: stopped after a
checkpoint, or killed at any moment, it resumes to bit-identical weights. The real build (SmolLM2, 300 games,
about two hours) is not run here: `agentgym-opd bench --track smollm2-alfworld` builds it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import evaluation.bench.alfworld_pair as ap
from agentgym_opd.distill import privileged_text
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.loading import model_path
from agentgym_opd.registry import make
from environments.alfworld.expert import play, train_prior
from environments.alfworld.replay import RecordingEnv, ReplayEnv, ReplayMiss
from evaluation.bench.base_data import scripted_example

from conftest import SHARED_DATA as DATA_ROOT

REPO = Path(__file__).resolve().parents[1]
TINY_SPEC = ap.AlfworldPairSpec("student", base="tiny", steps=3, batch_size=2, warmup_steps=1, train_tasks=2,
                                examples_per_game=3, context_share=0.6, mistake_share=0.5, checkpoint_every=1)


@pytest.fixture(autouse=True)
def data_root(monkeypatch):
    monkeypatch.setenv("AGENTGYM_OPD_DATA", str(DATA_ROOT))


@pytest.fixture(scope="module")
def games_cache(tmp_path_factory):
    """The recorded train games of TINY_SPEC (the first two), recorded once for the module."""
    root = tmp_path_factory.mktemp("pair-cache")
    os.environ["AGENTGYM_OPD_DATA"] = str(DATA_ROOT)
    original = ap.cache_root
    ap.cache_root = lambda: root
    try:
        games = ap.recorded_train_games(TINY_SPEC, progress=False, log=lambda line: None)
    finally:
        ap.cache_root = original
    return root, games


def use_cache(monkeypatch, tmp_path: Path, games_cache) -> Path:
    """A fresh cache root holding the module's recorded games (so each build starts from nothing else)."""
    root = tmp_path / "cache"
    root.mkdir(parents=True)
    for f in games_cache[0].glob("alfworld-games-*.jsonl"):
        shutil.copy(f, root / f.name)
    monkeypatch.setattr(ap, "cache_root", lambda: root)
    return root


@pytest.fixture(scope="module")
def tiny():
    return HFPolicy.from_pretrained(model_path("tiny"))


# ---------------------------------------------------------------------------------------------- replay
@pytest.fixture(scope="module")
def heat_game():
    """A pick_heat train game recorded along the expert's play and the walkthrough, and its real env."""
    os.environ["AGENTGYM_OPD_DATA"] = str(DATA_ROOT)
    env = make("alfworld/train", max_turns=40)
    task_id = next(t for t in env.task_ids() if t.startswith("pick_heat_then_place_in_recep-"))
    recorder = RecordingEnv(env)
    run = play(recorder, task_id, prior=train_prior(str(env.split_dir)))
    assert run.success
    game = recorder.games[task_id]
    game.privileged["demonstration"] = run.actions
    recorder.reset(options={"task_id": task_id})
    for action in game.privileged["walkthrough"]:
        recorder.step(action)
    yield env, game
    env.close()


@pytest.mark.slow
def test_a_replayed_game_makes_the_same_tokens_as_alfworld(heat_game, tiny):
    """Expert actions with a student's invalid commands, a line that is no command, and the walkthrough with
    its context: the rollout engine's ids and loss masks over the record equal those over TextWorld."""
    env, game = heat_game
    replay = ReplayEnv([game], max_turns=40)
    demo = game.privileged["demonstration"]
    with_mistakes, mistakes = ap.with_mistakes(game, demo, random.Random(3), max_turns=40, rate=0.6)
    assert mistakes, "the seeded draw puts mistakes in"
    garbled = demo[:2] + ["I think I should look around first"] + demo[2:]
    cases = [(with_mistakes, mistakes, None), (garbled, set(), None),
             (game.privileged["walkthrough"], set(), privileged_text(game.task()))]
    for actions, masked, context in cases:
        real, real_episode = scripted_example(tiny, env, game.task_id, actions, masked, context)
        replayed, replay_episode = scripted_example(tiny, replay, game.task_id, actions, masked, context)
        assert real == replayed
        assert real_episode.success and replay_episode.success
        kinds = [t.error.kind if t.error else None for t in real_episode.turns]
        assert kinds == [t.error.kind if t.error else None for t in replay_episode.turns]
    # the mistakes are rejected by the real engine and carry no loss
    real, real_episode = scripted_example(tiny, env, game.task_id, with_mistakes, mistakes)
    assert [i for i, t in enumerate(real_episode.turns) if t.error] == sorted(mistakes)
    assert all(real_episode.turns[i].error.kind == "invalid_action" for i in mistakes)


def test_a_replay_refuses_an_admissible_command_it_never_recorded(heat_game):
    _, game = heat_game
    replay = ReplayEnv([game])
    replay.reset(options={"task_id": game.task_id})
    taken = game.privileged["demonstration"][0]
    other = next(a for a in game.first_admissible if a.startswith("go to") and a != taken
                 and a not in game.privileged["walkthrough"][:1])
    with pytest.raises(ReplayMiss, match="play it in AlfWorldEnv first"):
        replay.step(other)


def test_mistakes_are_names_swapped_so_that_the_state_rejects_them(heat_game):
    _, game = heat_game
    demo = game.privileged["demonstration"]
    actions, mistakes = ap.with_mistakes(game, demo, random.Random(1), max_turns=len(demo) + 3, rate=1.0)
    assert len(mistakes) == 3  # bounded by the turn limit's slack
    assert ap.rejected_turns(ReplayEnv([game]), game.task_id, actions) == mistakes  # what the loss leaves out
    assert [a for i, a in enumerate(actions) if i not in mistakes] == demo
    for i in mistakes:
        following = actions[i + 1:]
        step = next(a for a in following if a in demo)
        assert actions[i] != step and actions[i].split(" ")[0] == step.split(" ")[0]


# ---------------------------------------------------------------------------------------------- data and schedule
def test_batches_are_a_function_of_seed_and_step_and_cover_each_epoch():
    spec = dataclasses.replace(TINY_SPEC, batch_size=4)
    first_epoch = [i for step in range(5) for i in ap.batch_indices(step, 20, spec)]
    assert sorted(first_epoch) == list(range(20))
    assert ap.batch_indices(7, 20, spec) == ap.batch_indices(7, 20, spec)
    assert ap.batch_indices(5, 20, spec) != ap.batch_indices(5, 20, dataclasses.replace(spec, seed=1))


def test_the_cache_key_covers_the_recipe_but_not_where_checkpoints_fall():
    assert TINY_SPEC.key() == dataclasses.replace(TINY_SPEC, checkpoint_every=7).key()
    assert TINY_SPEC.key() != dataclasses.replace(TINY_SPEC, steps=4).key()
    assert TINY_SPEC.key() != dataclasses.replace(TINY_SPEC, autocast="none").key()
    assert ap.TEACHER_SPEC.label() == "smollm2-alfworld-teacher-100steps-mistakes50"
    assert ap.STUDENT_SPEC.schedule_steps > ap.STUDENT_SPEC.steps  # the student stops partway
    assert ap.TEACHER_SPEC.steps > ap.STUDENT_SPEC.steps and ap.TEACHER_SPEC.mistake_share > 0


@pytest.mark.slow
def test_the_examples_carry_contexts_and_masked_mistakes(games_cache, tiny):
    _, games = games_cache
    spec = dataclasses.replace(TINY_SPEC, examples_per_game=12)
    examples, counts = ap.training_examples(tiny, spec, games)
    assert len(examples) == 24 and counts["games"] == 2
    assert counts.get("walkthrough") and counts.get("none") and counts.get("with_mistakes")
    text = tiny.tokenizer.decode(examples[[i for i in range(24)][0]][0])
    assert "Your task is to:" in text
    contexts = sum("Privileged information" in tiny.tokenizer.decode(ids) for ids, _ in examples)
    assert contexts == sum(counts.get(k, 0) for k in ("walkthrough", "sibling", "feedback"))
    for ids, mask in examples:
        assert any(mask) and len(ids) == len(mask)


# ---------------------------------------------------------------------------------------------- the build
def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


@pytest.mark.slow
def test_the_recipe_builds_a_model_on_the_tiny_base(monkeypatch, tmp_path, games_cache):
    root = use_cache(monkeypatch, tmp_path, games_cache)
    lines: list[str] = []
    model = ap.build_pair_model(TINY_SPEC, progress=False, log=lines.append)
    assert model == root / f"alfworld-student-{TINY_SPEC.key()}" / "model"
    assert (model.parent / "losses.json").is_file() and not (model.parent / "checkpoint.pt").exists()
    assert "alfworld-student" in (model / "agentgym_model.json").read_text()
    policy = HFPolicy.from_pretrained(model)
    assert policy.stop_token_ids  # the chat template's end of turn ends an action
    assert any("examples" in line for line in lines)
    # cached: the second call builds nothing
    lines.clear()
    assert ap.build_pair_model(TINY_SPEC, progress=False, log=lines.append) == model and not lines


@pytest.mark.slow
def test_a_build_stopped_after_a_checkpoint_resumes_to_identical_weights(monkeypatch, tmp_path, games_cache):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        use_cache(monkeypatch, tmp_path / "a", games_cache)
        straight = _weights(ap.build_pair_model(TINY_SPEC, progress=False, log=lambda line: None))
        root = use_cache(monkeypatch, tmp_path / "b", games_cache)
        with pytest.raises(ap.BuildStopped):
            ap.build_pair_model(TINY_SPEC, progress=False, log=lambda line: None, stop_after=2)
        partial = root / f"alfworld-student-{TINY_SPEC.key()}.partial"
        assert (partial / "checkpoint.pt").is_file() and (partial / "examples.json").is_file()
        lines: list[str] = []
        resumed = _weights(ap.build_pair_model(TINY_SPEC, progress=False, log=lines.append))
    finally:
        torch.set_num_threads(threads)
    assert any("resuming" in line and "step 2/3" in line for line in lines)
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


KILLED_BUILD = """
import sys, torch
from pathlib import Path
torch.set_num_threads(1)
import evaluation.bench.alfworld_pair as ap
ap.cache_root = lambda: Path(sys.argv[1])
spec = ap.AlfworldPairSpec(**{**ap.dataclasses.asdict(ap.AlfworldPairSpec("student")), **eval(sys.argv[2])})
ap.build_pair_model(spec, progress=False, progress_file=Path(sys.argv[3]))
"""


@pytest.mark.slow
def test_a_killed_build_process_resumes_to_identical_weights(monkeypatch, tmp_path, games_cache):
    """SIGKILL a build mid-training (whatever step it is at), then resume: the weights of an uninterrupted build."""
    changes = {"base": "tiny", "steps": 40, "batch_size": 2, "warmup_steps": 1, "train_tasks": 2,
               "examples_per_game": 3, "checkpoint_every": 1, "context_share": 0.6, "mistake_share": 0.5}
    spec = dataclasses.replace(ap.AlfworldPairSpec("student"), **changes)
    root = use_cache(monkeypatch, tmp_path / "killed", games_cache)
    progress = tmp_path / "progress"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(root), repr(changes), str(progress)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            done, total = (float(x) for x in progress.read_text().strip().split("/"))
            if done / total >= 3 / changes["steps"]:  # 3 steps in: the games are recorded already
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.005)
    assert proc.poll() is None, "the build ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = root / f"alfworld-student-{spec.key()}.partial"
    assert (partial / "checkpoint.pt").is_file() and not (root / f"alfworld-student-{spec.key()}").exists()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        lines: list[str] = []
        resumed = _weights(ap.build_pair_model(spec, progress=False, log=lines.append))
        use_cache(monkeypatch, tmp_path / "straight", games_cache)
        straight = _weights(ap.build_pair_model(spec, progress=False, log=lambda line: None))
    finally:
        torch.set_num_threads(threads)
    assert any("resuming" in line for line in lines)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_the_env_takes_recorded_demonstrations_as_privileged(tmp_path):
    """`AlfWorldEnv(demonstrations=FILE)`: each recorded game's expert actions become its task's demonstration
    (what SFT clones); a missing file is an error that says what the file is."""
    import json

    env = make("alfworld/train")
    first, second = env.task_ids()[:2]
    path = tmp_path / "games.jsonl"
    path.write_text(json.dumps({"task_id": first, "privileged": {"demonstration": ["go to desk 1", "look"]}}) + "\n"
                    + json.dumps({"task_id": second, "privileged": {"demonstration": []}}) + "\n")
    env = make("alfworld/train", demonstrations=str(path))
    assert env.get_task(first).privileged["demonstration"] == ["go to desk 1", "look"]
    assert "demonstration" not in env.get_task(second).privileged  # the expert failed there: none
    assert "demonstration" not in make("alfworld/train").get_task(first).privileged
    with pytest.raises(FileNotFoundError, match="recorded-games file"):
        make("alfworld/train", demonstrations=str(tmp_path / "none.jsonl"))


def test_build_progress_counts_recording_and_steps_in_forecast_seconds(monkeypatch, tmp_path):
    """A parent's bar moves during the half hour of recording games, not only during training steps."""
    from evaluation.bench.jobs import BaseModelJob, _steps_done

    monkeypatch.setattr(ap, "cache_root", lambda: tmp_path / "cache")
    spec = dataclasses.replace(ap.AlfworldPairSpec("student"), steps=40, train_tasks=300)
    file = tmp_path / "run" / "base_builds" / "warm_start.progress"
    file.parent.mkdir(parents=True)
    progress = ap.BuildProgress(spec, file)  # the games are not recorded: recording is part of the build
    job = BaseModelJob("warm_start", spec)
    progress.recorded(150)  # half of the games recorded
    half_recorded = _steps_done(job, tmp_path / "run")
    assert 0 < half_recorded < spec.steps / 2
    progress.trained(20)
    assert half_recorded < _steps_done(job, tmp_path / "run") < spec.steps
    progress.trained(40)
    assert _steps_done(job, tmp_path / "run") == spec.steps


def test_a_rejected_expert_command_leaves_the_state_whose_admissible_commands_the_mistakes_use():
    """ALFWorld answers a command it rejects with "Nothing happens." and records no step for it; the teacher's
    mistakes are drawn from the admissible commands of the state the expert is really in (this raised KeyError
    on the real train games, where 6 of 2,282 expert commands were rejected)."""
    from environments.alfworld.replay import RecordedGame, RecordedStep

    game = RecordedGame("t", "alfworld/train", "train", "put a mug on a shelf", {}, {}, "start", ["go to shelf 1"],
                        steps={"go to shelf 1": RecordedStep("at shelf 1", False, ["take mug 1 from shelf 1"]),
                               "go to shelf 1\ntake mug 1 from shelf 1": RecordedStep("got it", False, ["go to shelf 2"])})
    assert ap.state_admissible(game, []) == ["go to shelf 1"]
    assert ap.state_admissible(game, ["go to shelf 1", "go to shelf 1"]) == ["take mug 1 from shelf 1"]  # 2nd: rejected
    assert ap.state_admissible(game, ["go to shelf 1", "go to shelf 1", "take mug 1 from shelf 1"]) == ["go to shelf 2"]
    rng = random.Random(0)
    actions, mistakes = ap.with_mistakes(game, ["go to shelf 1", "go to shelf 1", "take mug 1 from shelf 1"], rng, 30,
                                         rate=1.0)
    assert mistakes and len(actions) > 3

"""Model policies through the uniform evaluation runner: the real tiny model on the household world.

Episodes are kept tiny (2 tasks, 2 turns, 8 new tokens) so the whole file runs in well under a minute on
a shared CPU; what is checked is the plumbing a researcher relies on: which weights are loaded, what the
record says, that seeds reproduce, and that bad input is refused with exit code 2.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from agentgym_opd.cli import main as cli_main
from agentgym_opd.config import load_config
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.registry import make, register
from agentgym_opd.trainer import DEFAULT_SYSTEM_PROMPT, Trainer
from evaluation.leaderboard import Leaderboard
from agentgym_opd.playing import play_tasks
from evaluation.policy_eval import EvalSetupError, evaluate_policy, load_policy, resolve_action_parser, resolve_policy
from evaluation.records import validate_record

ENV = "household/valid_unseen"
FAST = dict(episodes=2, max_new_tokens=8, max_turns=2, num_envs=4, device="cpu", progress=False)
FIRST_LINE = "test_eval_policy:first_line"


def first_line(text: str, finish_reason: str):
    """Send whatever the untrained model says to the env, so episodes are real multi-turn exchanges."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "look"), None


def _train(tmp_path, name: str, *overrides: str) -> Trainer:
    config = load_config(None, ["algorithm=sft", "env=household/train", "model.student=tiny", "model.device=cpu",
                                "train.steps=2", "train.lr=3e-3", "rollout.tasks_per_step=1", "rollout.max_turns=4",
                                "rollout.max_new_tokens=8", "eval.episodes=1", f"output_dir={tmp_path / name}",
                                *overrides])
    trainer = Trainer(config, env_overrides={"num_tasks": 2}, progress=False)
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """A real SFT run (2 steps on the tiny model) with a non-default algorithm knob, checkpointed at the end."""
    return _train(tmp_path_factory.mktemp("runs"), "sft", "algo.aggregation=seq_mean_token_mean",
                  "rollout.system_prompt=Act now.")


@pytest.mark.slow
def test_tiny_model_record_is_valid_and_uses_the_trainer_prompt():
    (record,) = evaluate_policy(ENV, "tiny", **FAST)
    assert validate_record(record) is record
    assert (record["env_id"], record["split"], record["n_episodes"]) == (ENV, "valid_unseen", 2)
    assert (record["algorithm"], record["student"], record["teacher"], record["seed"]) == ("base", "tiny", None, 0)
    assert record["metrics"]["mean_turns"]["mean"] <= 2 and "pass@1" not in record["metrics"]
    # the untrained model rambles past 8 tokens: every turn is a parse error the env never sees
    assert record["metrics"]["error_rate/parse_error"]["mean"] == 1.0
    assert record["protocol"]["temperature"] == 0.0 and record["protocol"]["samples"] == 1


@pytest.mark.slow
def test_episodes_are_batched_reproducible_and_independent_of_chunking():
    policy = load_policy(resolve_policy("tiny"), device="cpu")
    tasks = make(ENV).task_ids()[:2]
    run = dict(samples=2, sampling=SamplingParams(max_new_tokens=8, temperature=1.0),
               action_parser=resolve_action_parser(FIRST_LINE), system_prompt=DEFAULT_SYSTEM_PROMPT,
               env_kwargs={"max_turns": 2})
    wide = play_tasks(policy, ENV, tasks, seed=5_000_000, batch_size=4, **run)   # one batch of 4 envs
    narrow = play_tasks(policy, ENV, tasks, seed=5_000_000, batch_size=2, **run)  # two batches of 2
    other = play_tasks(policy, ENV, tasks, seed=6_000_000, batch_size=4, **run)
    assert [e.task.id for e in wide] == [tasks[0], tasks[0], tasks[1], tasks[1]]
    assert [e.metadata["rollout_seed"] for e in narrow] == [5_000_000 + k for k in range(4)]
    assert all(e.first_prompt[0] == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT} for e in wide)
    assert [e.input_ids for e in wide] == [e.input_ids for e in narrow]
    assert wide[0].input_ids != wide[1].input_ids  # two samples of one task differ
    assert [e.input_ids for e in wide] != [e.input_ids for e in other]


@pytest.mark.slow
def test_same_seeds_give_the_same_numbers_and_samples_give_pass_at_k():
    sampled = dict(FAST, episodes=1, samples=3, temperature=1.0, action_parser=FIRST_LINE)
    first = evaluate_policy(ENV, "tiny", seeds=[0, 1], **sampled)
    again = evaluate_policy(ENV, "tiny", seeds=[0], **sampled)
    assert [r["seed"] for r in first] == [0, 1] and first[0]["n_episodes"] == 3
    assert again[0]["metrics"] == first[0]["metrics"]
    assert {"pass@1", "pass@3"} <= set(first[0]["metrics"]) and "pass@5" not in first[0]["metrics"]
    assert first[0]["metrics"]["pass@1"]["mean"] == first[0]["metrics"]["success_rate"]["mean"]
    with pytest.raises(EvalSetupError, match="--temperature > 0"):
        evaluate_policy(ENV, "tiny", **dict(FAST, samples=2))


@pytest.mark.slow
def test_checkpoint_and_run_folder_load_the_trained_weights_and_name_the_algorithm(sft_run):
    step = sft_run.checkpoint_dir()
    assert step.name == "step_2"
    assert resolve_policy(str(sft_run.output_dir)).model_dir == step / "model"  # run folder -> latest
    loaded = load_policy(resolve_policy(str(step)), device="cpu")
    trained = dict(sft_run.student.model.named_parameters())
    for name, value in loaded.model.named_parameters():
        torch.testing.assert_close(value, trained[name].detach(), rtol=0, atol=0)
    (record,) = evaluate_policy(ENV, str(sft_run.output_dir), **FAST)
    assert (record["algorithm"], record["student"], record["teacher"]) == ("sft", "tiny", None)
    assert record["algorithm_config"] == {"aggregation": "seq_mean_token_mean", "context_fraction": 0.0,
                                          "expert": "observable"}
    assert (record["protocol"]["action_parser"], record["protocol"]["system_prompt"]) == ("text", "Act now.")  # as trained
    validate_record(record)


def test_lora_checkpoint_loads_base_plus_adapter(tmp_path):
    trainer = _train(tmp_path, "lora", "model.lora_rank=4", "train.steps=1", "train.lr=5e-2")
    source = resolve_policy(str(trainer.checkpoint_dir()))
    assert source.is_adapter and source.base_dir is not None and source.algorithm == "sft"
    loaded = load_policy(source, device="cpu")
    ids = torch.tensor([trainer.student.apply_chat_template([{"role": "user", "content": "go to fridge 1"}])])
    with torch.no_grad():
        with trainer.student.adapter_disabled():
            base_logits = trainer.student.model(input_ids=ids).logits
        trained_logits = trainer.student.model(input_ids=ids).logits
        loaded_logits = loaded.model(input_ids=ids).logits
    assert not torch.allclose(base_logits, trained_logits, atol=1e-4)  # the adapter learned something
    torch.testing.assert_close(loaded_logits, trained_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_cli_writes_one_record_per_seed_that_the_leaderboard_groups(tmp_path, capsys):
    out = tmp_path / "rec.json"
    rc = cli_main(["eval", "--policy", "tiny", "--env", ENV, "--episodes", "2", "--max-new-tokens", "8",
                   "--max-turns", "2", "--device", "cpu", "--seeds", "0", "1", "--no-progress", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    paths = [tmp_path / "rec.seed0.json", tmp_path / "rec.seed1.json"]
    records = [validate_record(json.loads(p.read_text())) for p in paths]
    assert [r["seed"] for r in records] == [0, 1]
    board = Leaderboard(tmp_path / "lb")
    for p in paths:
        board.add(p)
    board.build()
    # each record keeps its episodes (failures first) and the page shows them turn by turn
    kept = records[0]["episodes"]
    assert len(kept) == 2 and all(not ep["success"] for ep in kept) and len(kept[0]["turns"]) == 2
    assert kept[0]["turns"][0]["error_kind"] == "parse_error" and kept[0]["turns"][0]["tokens"]
    page = next((tmp_path / "lb" / "episodes").glob("*.html")).read_text()
    assert "parse_error" in page and kept[0]["task_id"] in page
    prompt = "#" + hashlib.sha256(DEFAULT_SYSTEM_PROMPT.encode()).hexdigest()[:6]  # the family's prompt, by fingerprint
    assert (f"| {ENV} | base [max_new_tokens=8 max_turns=2 system_prompt={prompt}] | tiny | - | 0,1 | 4 |"
            in (tmp_path / "lb" / "LEADERBOARD.md").read_text())
    assert records[0]["protocol"]["system_prompt"] == DEFAULT_SYSTEM_PROMPT and records[0]["throughput"]["agent_tokens"] > 0
    lines = [json.loads(line) for line in (tmp_path / "rec.seed0.episodes.jsonl").read_text().splitlines()]
    assert [line["index"] for line in lines] == [0, 1] and all(line["turns"] == 2 for line in lines)
    turn = lines[0]["transcript"]["turns"][0]
    assert turn["error"]["kind"] == "parse_error" and turn["reply"] and turn["observation"] == turn["error"]["message"]


@pytest.mark.parametrize("argv, message", [
    (["--policy", "no/such/model"], "no such file or folder"),
    (["--policy", "{empty}"], "holds no model"),
    (["--policy", "{file}"], "is a file, not a model folder"),
    (["--policy", "{broken}"], "cannot load a model from"),
    (["--policy", "tiny", "--env", "household/valid_unseeen"], "Did you mean: household/valid_unseen"),
    (["--policy", "tiny", "--env", "testcounter/empty"], "has no tasks"),
    (["--policy", "tiny", "--samples", "3"], "--temperature > 0"),
    (["--policy", "tiny", "--backend", "vllm"], "needs vLLM"),
    (["--policy", "tiny", "--action-parser", "yaml"], "unknown action parser"),
    (["--policy", "tiny", "--executor", "ray"], "scripted agents"),
])
def test_bad_input_is_a_clear_error_with_exit_code_2(tmp_path, capsys, argv, message):
    register("testcounter/empty", entry_point="counter_env:CounterEnv", num_tasks=0, override=True)
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"\0")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{}")  # looks like a HF folder, holds no loadable model
    argv = [a.format(empty=tmp_path / "empty", file=tmp_path / "weights.bin", broken=tmp_path / "broken") for a in argv]
    if "--env" not in argv:
        argv += ["--env", ENV]
    rc = cli_main(["eval", *argv, "--episodes", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and message in err, err
    assert "Traceback" not in err


_CALLS = {"n": 0}


def interrupt_on_third_reply(text: str, finish_reason: str):
    """A parser that stands in for Ctrl-C: the third reply of the run raises KeyboardInterrupt."""
    _CALLS["n"] += 1
    if _CALLS["n"] == 3:
        raise KeyboardInterrupt
    return "look", None


def test_an_interrupted_run_keeps_the_finished_episodes_as_a_partial_record(tmp_path):
    _CALLS["n"] = 0
    out = tmp_path / "rec.json"
    with pytest.raises(KeyboardInterrupt, match="after 1 episodes"):
        evaluate_policy(ENV, "tiny", out_paths=[out], action_parser="test_eval_policy:interrupt_on_third_reply",
                        **dict(FAST, num_envs=1))  # batches of one episode: 2 turns each
    record = validate_record(json.loads(out.read_text()))
    assert record["n_episodes"] == 1 and record["protocol"]["partial"] is True
    (line,) = [json.loads(x) for x in (tmp_path / "rec.episodes.jsonl").read_text().splitlines()]
    assert line["turns"] == 2 and [t["action"] for t in line["transcript"]["turns"]] == ["look", "look"]


def test_episodes_reach_the_caller_as_they_end_and_the_batch_fits_the_memory_budget():
    policy = load_policy(resolve_policy("tiny"), device="cpu")
    seen: list[tuple[int, str, int]] = []
    tasks = make(ENV).task_ids()[:3]
    episodes = play_tasks(policy, ENV, tasks, sampling=SamplingParams(max_new_tokens=4, temperature=0.0),
                          action_parser=resolve_action_parser(FIRST_LINE), system_prompt=None, batch_size=2,
                          env_kwargs={"max_turns": 1},
                          on_episode=lambda i, ep: seen.append((i, ep.task.id, ep.num_turns)))
    assert [e.task.id for e in episodes] == tasks
    assert sorted(seen) == [(i, t, 1) for i, t in enumerate(tasks)]  # each once, by its place, already played
    from agentgym_opd.playing import rows_for_memory

    weights = sum(p.numel() * p.element_size() for p in policy.model.parameters())
    small, large = (rows_for_memory(policy, 512, weights + mb * 2**20) for mb in (1, 4096))
    assert small == 1 and large > 8  # at least one row; more memory, more rows side by side
    assert rows_for_memory(policy, 2048, weights + 4096 * 2**20) < large  # longer contexts, fewer rows


def test_smollm2_is_a_policy_name():
    from agentgym_opd.policy.loading import NAMED_MODELS, model_path

    assert set(NAMED_MODELS) == {"tiny", "smollm2"}
    source = resolve_policy("smollm2")  # converts once into the cache on first use
    assert source.student == "smollm2" and (source.model_dir / "config.json").is_file()
    assert model_path("smollm2") == str(source.model_dir) and model_path("some/folder") == "some/folder"


def test_a_model_folder_with_a_name_file_is_named_by_it_and_so_are_runs_trained_from_it(tmp_path):
    """The bench's base models carry `agentgym_model.json`: an eval of the folder, or of a run whose
    model.student / model.teacher is that folder, names it as the bench's rows do, not by a cache path."""
    import shutil

    from agentgym_opd.policy.loading import MODEL_NAME_FILE, _tiny_path

    base = tmp_path / "cache" / "student-abc" / "model"
    shutil.copytree(_tiny_path(), base)
    assert resolve_policy(str(base)).student == str(base)  # no name file: the path as given
    (base / MODEL_NAME_FILE).write_text(json.dumps({"name": "household-student-64x2-1000steps"}))
    assert resolve_policy(str(base)).student == "household-student-64x2-1000steps"
    step = tmp_path / "run" / "checkpoints" / "step_4"
    (step / "model").mkdir(parents=True)
    (step / "model" / "config.json").write_text("{}")
    (step / "config.yaml").write_text(f"algorithm: opd\nmodel:\n  student: {base}\n  teacher: {base}\n")
    source = resolve_policy(str(step))
    assert (source.algorithm, source.student, source.teacher) == ("opd", "household-student-64x2-1000steps",
                                                                  "household-student-64x2-1000steps")
    (base / MODEL_NAME_FILE).write_text('{"name": "two\\nlines"}')  # not a cell a table can show: the path
    assert resolve_policy(str(base)).student == str(base)


def test_bench_tasks_are_each_seeds_block_exactly_as_the_bench_evaluates_it(tmp_path):
    """`eval --bench-tasks` plays, per seed, the tasks the bench gives that seed (so a record compares with
    the bench's task for task), sizing the split as the bench does; without it every seed plays the same
    evenly spread tasks."""
    import agentgym_opd
    from evaluation.bench.episodes import eval_task_ids
    from evaluation.bench.settings import BenchSettings
    from evaluation.policy_eval import seed_tasks
    from evaluation.runner import bench_split_args

    settings = BenchSettings(seeds=[0, 1, 2])
    env_id = "household/valid_unseen"
    for seed in (0, 2):
        ids = agentgym_opd.make(env_id, **bench_split_args(env_id, [seed], 100)).task_ids()
        assert seed_tasks(env_id, ids, seed, 100, True) == eval_task_ids(env_id, settings, seed)
    plain = agentgym_opd.make(env_id).task_ids()
    assert seed_tasks(env_id, plain, 0, 10, False) == seed_tasks(env_id, plain, 2, 10, False)  # same for every seed
    with pytest.raises(EvalSetupError, match="num_tasks=300"):
        seed_tasks(env_id, plain, 2, 100, True)  # the default split is too short for seed 2's block
    with pytest.raises(EvalSetupError, match="--bench-tasks needs --episodes"):
        seed_tasks(env_id, plain, 0, None, True)
    # through the CLI: each seed's record states the tasks it played, and the stamp hashes those same tasks
    from agentgym_opd.cli import main
    from evaluation.provenance import tasks_sha256

    assert main(["eval", "--policy", "tiny", "--env", env_id, "--episodes", "2", "--bench-tasks", "--seeds", "0", "2",
                 "--max-new-tokens", "4", "--max-turns", "1", "--device", "cpu", "--no-progress",
                 "--out", str(tmp_path / "rec.json")]) == 0
    env = agentgym_opd.make(env_id)
    for seed, first in ((0, 0), (2, 4)):
        record = json.loads((tmp_path / f"rec.seed{seed}.json").read_text())
        played = [json.loads(line)["task_id"] for line in (tmp_path / f"rec.seed{seed}.episodes.jsonl").read_text().splitlines()]
        assert sorted(played) == sorted(plain[first:first + 2])
        assert record["provenance"]["tasks_sha256"] == tasks_sha256([env.get_task(t) for t in plain[first:first + 2]])


def test_a_batch_of_simulator_games_counts_each_games_jvm():
    """ScienceWorld and TextWorldExpress start a JVM per game: the batch sizing counts it (23 ScienceWorld games
    side by side under a 4 GB budget once started 23 JVMs, 12 GB, and the machine killed a training job)."""
    from agentgym_opd.playing import rows_for_memory
    from agentgym_opd.policy.loading import load_student
    from agentgym_opd.config import ModelConfig
    from agentgym_opd.registry import env_instance_memory

    assert env_instance_memory("household/valid_unseen") == 0
    jvm = env_instance_memory("scienceworld/find-living-thing")
    assert jvm == env_instance_memory("textworld_express/coin") >= 512 * 2**20
    policy = load_student("tiny", ModelConfig(), trainable=False)
    weights = sum(p.numel() * p.element_size() for p in policy.model.parameters())
    budget = weights + 4 * 2**30
    plain = rows_for_memory(policy, 2048, budget)
    with_jvms = rows_for_memory(policy, 2048, budget, env_bytes=jvm)
    assert with_jvms <= 4 * 2**30 // jvm < plain  # the JVMs alone fit the budget, not more

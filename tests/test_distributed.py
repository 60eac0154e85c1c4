"""Data-parallel training is the one-process step: 1 vs 2 processes (gloo on CPU), DDP and FSDP2, real batches,
for every algorithm.

The parent collects ONE real rollout batch (tiny model, household/train, 2 tasks x group 2, rewards,
successes, feedback and a mix of agent errors and clean turns set so every method has signal) and one
expert batch, and trains a fresh copy of the tiny model on each for 3 SGD steps in one process, on the
full batch in one micro-batch (the exact global loss). Two spawned ranks (torchrun-style env variables, a
free port) each load the same model, wrap it, take their shard and run the same 3 steps with micro-batch
1; rank 0 gathers the full state dict (and LOPD's composer). Per-step global losses and final weights must
match to 1e-5. The shards hold different token counts, so a per-rank normaliser would not match.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import agentgym_opd
from agentgym_opd import distributed as D
from agentgym_opd.algorithm import Algorithm
from agentgym_opd.policy.base import SamplingParams
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.rollout import RolloutEngine
from agentgym_opd.trainer import DEFAULT_SYSTEM_PROMPT
from algorithms.grpo import GRPO, GRPOConfig
from algorithms.sft import SFT, SFTConfig, concat_batches, expert_batch
from tiny_rollouts import accept_any

ENV = "household/train"
STEPS = 3
LR = 0.05
GRAD_CLIP = 0.1  # below the gradient norms of most cases (checked), so clipping is part of the comparison
WORLD = 2

# case -> (algorithm, config overrides, batch); scenario -> (case, strategy)
CASES = {
    "grpo_token_mean": ("grpo", {"aggregation": "token_mean", "kl_coef": 0.05}, "grpo"),
    "grpo_seq_mean": ("grpo", {"aggregation": "seq_mean_token_mean"}, "grpo"),
    "sft": ("sft", {}, "sft"),
    "opd": ("opd", {}, "grpo"),
    "opsd": ("opsd", {"top_m": 8}, "grpo"),
    "sdpo": ("sdpo", {"distill_weight": 0.5}, "grpo"),
    "sage_opd": ("sage_opd", {"judge": "errors_only"}, "grpo"),
    "vpd": ("vpd", {"e_updates": 1, "m_steps_per_e_step": 1}, "grpo"),
    "lopd": ("lopd", {"embedder": "hashing", "top_m": 8, "num_experiences": 1, "beta_init": 0.5,
                      "experience_max_tokens": 32, "composer_lr": 1.0}, "grpo"),
    "lopd_lora": ("lopd", {"embedder": "hashing", "top_m": 8, "num_experiences": 1, "beta_init": 0.5,
                           "experience_max_tokens": 32, "composer_lr": 1.0}, "grpo"),  # a LoRA student, as LOPD's recipe
}
SCENARIOS = {
    "ddp/grpo_token_mean": ("grpo_token_mean", "ddp"),
    "ddp/grpo_seq_mean": ("grpo_seq_mean", "ddp"),
    "ddp/sft": ("sft", "ddp"),
    "fsdp/grpo_token_mean": ("grpo_token_mean", "fsdp"),
    "fsdp/sft": ("sft", "fsdp"),
    **{f"ddp/{case}": (case, "ddp") for case in ("opd", "opsd", "sdpo", "sage_opd", "vpd", "lopd")},
    "fsdp/lopd": ("lopd", "fsdp"),
    "fsdp/opd": ("opd", "fsdp"),  # the chunked path through FSDP's own forward, a separate and a self-teacher
    "fsdp/sdpo": ("sdpo", "fsdp"),
    "ddp/lopd_lora": ("lopd_lora", "ddp"),
}


def load_student(model_path, case: str):
    from agentgym_opd.policy.hf import LoraConfig

    torch.manual_seed(5)  # a LoRA's initial A: the same in every process, whatever ran before in it
    return HFPolicy.from_pretrained(model_path, lora=LoraConfig(r=4, alpha=8) if case.endswith("_lora") else None)


def make_algorithm(case: str, student, micro_batch_size: int, teacher_path, bank_dir) -> Algorithm:
    from agentgym_opd.registry import algorithm_registry, load_entry_point

    name, overrides, _ = CASES[case]
    cls = load_entry_point(algorithm_registry.spec(name).entry_point)
    config = dict(overrides)
    if name == "lopd":
        config["bank_path"] = str(bank_dir)
    teacher = None
    if cls.needs_teacher:
        teacher = HFPolicy.from_pretrained(teacher_path)
        teacher.model.requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in student.model.parameters() if p.requires_grad], lr=LR)
    torch.manual_seed(7)  # LOPD's composer: the same initial weights in every process
    return cls(config, student, teacher, optimizer=optimizer, grad_clip=GRAD_CLIP, micro_batch_size=micro_batch_size)


def batch_of(case: str, batches: dict):
    return batches[CASES[case][2]]


def composer_state(algo) -> dict:
    return algo.composer.trainable_state() if hasattr(algo, "composer") else {}


def run_one_process(model_path, case: str, batch, *, micro_batch_size: int, teacher_path=None, bank_dir=None):
    """Reference: 3 steps in this process; returns (losses, grad norms, final state dict, composer state)."""
    policy = load_student(model_path, case)
    algo = make_algorithm(case, policy, micro_batch_size, teacher_path, bank_dir)
    if hasattr(algo, "remember"):
        algo.remember(batch.episodes)
    losses, norms = [], []
    for _ in range(STEPS):
        metrics = algo.update(batch)
        losses.append(metrics["loss"])
        norms.append(metrics["grad_norm"])
    return losses, norms, {k: v.detach().clone() for k, v in policy.model.state_dict().items()}, composer_state(algo)


def _rank_main(rank: int, port: int, model_path: str, batch_file: str, out_dir: str, teacher_path: str) -> None:
    """One rank of the 2-process run: env variables as torchrun sets them, then every scenario in turn."""
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    ctx = D.init_distributed(timeout_s=120)
    assert ctx.enabled and ctx.backend == "gloo" and ctx.rank == rank
    batches = torch.load(batch_file, weights_only=False)
    results = {}
    for scenario, (case, strategy) in SCENARIOS.items():
        policy = load_student(model_path, case)
        bank_dir = os.path.join(out_dir, f"bank-{scenario.replace('/', '-')}")
        algo = D.distribute_algorithm(make_algorithm(case, policy, 1, teacher_path, bank_dir), strategy, ctx)
        algo.dist = ctx
        wrapped = algo.model
        local = D.shard_batch(batch_of(case, batches), ctx)
        if hasattr(algo, "remember"):
            algo.remember(local.episodes)  # every rank banks every rank's successes
        losses = [algo.update(local)["loss"] for _ in range(STEPS)]
        results[scenario] = {"losses": losses, "state": D.full_state_dict(wrapped, ctx), "composer": composer_state(algo),
                             "local_tokens": D.all_reduce_sum_list([float(local.loss_mask[:, 1:].sum())], ctx),
                             "wrapper": type(wrapped).__name__}
    if ctx.is_main:
        torch.save(results, os.path.join(out_dir, "results.pt"))
    D.teardown(ctx)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: on a shared 2-core machine, 2 threads per process run ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def batches():
    """A real on-policy batch of two groups (rewards set so advantages are +-1) and a real expert batch."""
    torch.manual_seed(0)
    policy = HFPolicy.from_pretrained(default_tiny_model())
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=8), action_parser=accept_any)
    tasks = agentgym_opd.make(ENV).task_ids()[:2]
    # a group of 2-turn episodes and one of 3-turn episodes, so the two ranks' token counts differ
    groups = [engine.collect(ENV, [task], group_size=2, seed=3 + 2 * k, max_turns=2 + k) for k, task in enumerate(tasks)]
    grpo = concat_batches(groups, pad_id=policy.pad_id)
    grpo.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    for row, episode in enumerate(grpo.episodes):
        episode.success = row in (0, 3)
        episode.feedback = "" if episode.success else "Nothing happened."
        episode.turns[-1].error = None  # a clean turn next to the agent's errors (SAGE-OPD's Weak)
    template = RolloutEngine(policy, SamplingParams(max_new_tokens=8), system_prompt=DEFAULT_SYSTEM_PROMPT)
    env = agentgym_opd.make(ENV, num_tasks=3, max_turns=10)
    sft = expert_batch(policy, env, env.task_ids()[:2], engine_template=template)
    return {"grpo": grpo, "sft": sft}


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    """A separate teacher for OPD and SAGE-OPD: the tiny model with perturbed weights."""
    torch.manual_seed(5)
    teacher = HFPolicy.from_pretrained(default_tiny_model())
    with torch.no_grad():
        for p in teacher.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("teacher") / "model"
    teacher.model.save_pretrained(path)
    teacher.tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def references(batches, teacher_path, tmp_path_factory):
    """The one-process runs on the full batch, one micro-batch: the exact global loss of each case."""
    path = default_tiny_model()
    banks = tmp_path_factory.mktemp("banks")
    return {case: run_one_process(path, case, batch_of(case, batches), micro_batch_size=len(batch_of(case, batches)),
                                  teacher_path=teacher_path, bank_dir=banks / case)
            for case in CASES}


@pytest.fixture(scope="module")
def two_process_results(batches, teacher_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    batch_file = out / "batches.pt"
    torch.save(batches, batch_file)
    mp.spawn(_rank_main, args=(free_port(), str(default_tiny_model()), str(batch_file), str(out), teacher_path),
             nprocs=WORLD, join=True)
    return torch.load(out / "results.pt", weights_only=False)


def assert_same_weights(got: dict, want: dict) -> float:
    """Every parameter of the reference is in ``got`` and equal to 1e-5; returns the largest difference."""
    missing = set(want) - set(got)
    assert not missing - {"lm_head.weight"}, f"gathered state dict lacks {sorted(missing)[:3]}"
    worst = 0.0
    for name, value in want.items():
        if name in got:
            torch.testing.assert_close(got[name], value, atol=1e-5, rtol=0, msg=lambda m: f"{name}: {m}")
            worst = max(worst, float((got[name] - value).abs().max()))
    return worst


@pytest.mark.slow
def test_the_batches_make_the_comparison_meaningful(batches, references, tmp_path):
    """Shards hold different token counts, clipping is active, weights move (every method)."""
    ctx0, ctx1 = D.DistContext(rank=0, world_size=WORLD), D.DistContext(rank=1, world_size=WORLD)
    for name in ("grpo", "sft"):
        tokens = [int(D.shard_batch(batches[name], c).loss_mask[:, 1:].sum()) for c in (ctx0, ctx1)]
        assert tokens[0] != tokens[1] and min(tokens) > 0, tokens
    initial = HFPolicy.from_pretrained(default_tiny_model()).model.state_dict()
    lora_initial = load_student(default_tiny_model(), "lopd_lora").model.state_dict()
    clipped = [case for case, (_, norms, _, _) in references.items() if max(norms) > GRAD_CLIP]
    assert {"grpo_token_mean", "sft", "opd", "sage_opd", "vpd", "lopd"} <= set(clipped), {c: max(n) for c, (_, n, _, _) in references.items()}
    for case, (losses, norms, state, _) in references.items():
        start = lora_initial if case.endswith("_lora") else initial
        moved = max(float((state[k] - start[k]).abs().max()) for k in start)
        if not case.startswith("lopd"):
            assert moved > 1e-4, (case, moved)
            continue
        # LOPD's teacher starts as the student, so the student moves little; its composer must move
        fresh = make_algorithm(case, load_student(default_tiny_model(), case), 1, None, tmp_path / case)
        composer = references[case][3]
        assert max(float((composer[k] - v).abs().max()) for k, v in composer_state(fresh).items()) > 1e-3, case


@pytest.mark.slow
def test_two_processes_match_one_process_for_every_method(two_process_results, references):
    for scenario, (case, strategy) in SCENARIOS.items():
        got = two_process_results[scenario]
        losses, _, state, composer = references[case]
        assert got["wrapper"] == ("_DDP" if strategy == "ddp" else "FSDPLlamaForCausalLM")
        assert got["losses"] == pytest.approx(losses, abs=1e-5), scenario
        assert_same_weights(got["state"], state)
        assert got["composer"].keys() == composer.keys()
        for name, value in composer.items():  # LOPD's composer: synced, clipped and stepped like one process
            torch.testing.assert_close(got["composer"][name], value, atol=1e-5, rtol=0, msg=lambda m: f"{scenario} {name}: {m}")
    assert references["lopd"][3], "LOPD's composer state is compared"


def test_per_rank_rollouts_are_the_shards_of_the_one_process_batch():
    """shard_tasks + its seed offset: rank 1 collecting alone samples the very tokens of rows 2..3."""
    policy = HFPolicy.from_pretrained(default_tiny_model())
    engine = RolloutEngine(policy, SamplingParams(max_new_tokens=6), action_parser=accept_any)
    tasks = agentgym_opd.make(ENV).task_ids()[:2]
    whole = engine.collect(ENV, tasks, group_size=2, seed=11, max_turns=2)
    local_tasks, first_row = D.shard_tasks(tasks, D.DistContext(rank=1, world_size=2), group_size=2)
    local = engine.collect(ENV, local_tasks, group_size=2, seed=11 + first_row, max_turns=2)
    assert [e.input_ids for e in local.episodes] == [e.input_ids for e in whole.episodes[2:]]
    assert len({tuple(e.input_ids) for e in whole.episodes}) == 4  # sampled, not all the same


@pytest.mark.slow
def test_sharding_rules(batches):
    with pytest.raises(ValueError, match="5 rows does not split evenly over world size 2"):
        D.shard_rows(5, 0, 2)
    assert D.shard_rows(6, 2, 3) == slice(4, 6)
    shard = D.shard_batch(batches["grpo"], D.DistContext(rank=1, world_size=2))
    assert len(shard) == 2 and shard.group_ids.tolist() == [1, 1] and shard.rewards.tolist() == [0.0, 1.0]
    assert shard.episodes == batches["grpo"].episodes[2:]
    with pytest.raises(ValueError, match="cuts group 0"):
        D.shard_batch(batches["grpo"], D.DistContext(rank=0, world_size=4))
    tasks, first_row = D.shard_tasks(["a", "b", "c", "d"], D.DistContext(rank=1, world_size=2), group_size=3)
    assert tasks == ["c", "d"] and first_row == 6


def test_single_process_is_a_no_op_and_bad_launch_env_is_explained(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    ctx = D.init_distributed()
    assert not ctx.enabled and ctx.is_main and ctx.world_size == 1
    model = torch.nn.Linear(2, 2)
    assert all(D.wrap_model(model, s, ctx) is model for s in D.STRATEGIES)
    with pytest.raises(ValueError, match="unknown distributed strategy 'zero3'"):
        D.wrap_model(model, "zero3", ctx)
    assert D.all_reduce_mean({"loss": 2.0}, ctx) == {"loss": 2.0}
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="RANK is not set: launch with torchrun"):
        D.init_distributed()
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="MASTER_ADDR is not set"):
        D.init_distributed()
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(RuntimeError, match="RANK=2 is outside"):
        D.init_distributed()


# ----------------------------------------------------------------------------------------------------
# The same `agentgym-opd train` command under torchrun
# ----------------------------------------------------------------------------------------------------


def _train_cli(out, *prefix: str, strategy: str = "none") -> list[str]:
    return [*prefix, "-m", "agentgym_opd.cli", "train", "--algo", "sft", "--env", "household/train", "--student", "tiny",
            "--output-dir", str(out), "--no-progress", "--env-arg", "num_tasks=4", "model.device=cpu",
            "train.steps=3", "train.lr=1e-3", "train.optimizer=sgd", "train.micro_batch_size=1",
            "rollout.tasks_per_step=2", "rollout.max_turns=4", f"train.strategy={strategy}"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.slow
def test_train_command_under_torchrun_matches_one_process(tmp_path, strategy):
    """`torchrun --nproc_per_node 2 -m agentgym_opd.cli train ... train.strategy=X` is the one-process run."""
    import json
    import subprocess
    import sys

    one, two = tmp_path / "one", tmp_path / "two"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(_train_cli(one, sys.executable), cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(port)]
    done = subprocess.run(_train_cli(two, *torchrun, strategy=strategy), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    rows = {name: [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            for name, out in (("one", one), ("two", two))}
    assert [r["step"] for r in rows["two"]] == [1, 2, 3], "rank 0 alone logs, once per step"
    assert all(r["world_size"] == 2 and r["strategy"] == strategy for r in rows["two"])
    for a, b in zip(rows["one"], rows["two"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), (strategy, a["step"])
        assert b["tokens"] == a["tokens"], "global token totals, not one rank's"
    final = {name: torch.load(out / "checkpoints" / "step_3" / "trainer_state.pt", weights_only=False)["trainable"]
             for name, out in (("one", one), ("two", two))}
    assert final["one"].keys() == final["two"].keys()
    for name in final["one"]:
        torch.testing.assert_close(final["two"][name], final["one"][name], rtol=1e-5, atol=1e-6)
    reloaded = HFPolicy.from_pretrained(two / "checkpoints" / "step_3" / "model")  # the saved model is whole
    for name, value in final["one"].items():
        torch.testing.assert_close(dict(reloaded.model.named_parameters())[name].detach(), value, rtol=1e-5, atol=1e-6)

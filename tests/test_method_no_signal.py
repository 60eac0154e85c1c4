"""A batch with no learning signal takes no optimiser step, for every method, micro-batch size and rank count.

Such a batch has a loss of 0 and zero gradients, but AdamW would still move the weights: its momentum from
earlier steps and its weight decay act on every step. So the base class skips the step whole. Each test
first takes one real AdamW step (momentum and weight decay are live), then updates on a batch with no signal
(every row masked: SDPO, OPSD, LOPD; every turn Skip: SAGE-OPD; every advantage 0: GRPO; no feedback: VPD)
and requires the weights, the optimiser state and the method's own state (EMA teacher, dual variable) to be
bit-identical, with ``update/skipped`` reported. Two gloo ranks must agree: one rank with signal makes both
step, none makes both skip.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import agentgym_opd
from agentgym_opd import distributed as D
from agentgym_opd.algorithm import SKIPPED
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.types import StepError
from algorithms.grpo import GRPO
from algorithms.lopd import LOPD
from algorithms.opsd import OPSD
from algorithms.sage_opd import SAGEOPD
from algorithms.sdpo import SDPO
from algorithms.vpd import VPD
from tiny_rollouts import HOUSEHOLD, perturbed_tiny_teacher, tiny_household_rollout

LR, WEIGHT_DECAY = 1e-3, 0.1


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def rollout():
    return tiny_household_rollout(seed=1, max_turns=3, max_new_tokens=6)[1]


def with_signal(batch):
    """Rows 0 and 3 succeed (one per task), the others failed with feedback; turn 0 is an agent error."""
    batch = copy.deepcopy(batch)
    batch.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    for row, episode in enumerate(batch.episodes):
        episode.success = row in (0, 3)
        episode.feedback = "" if episode.success else "Nothing happened."
        episode.turns[0].error = StepError("invalid_action", "Nothing happens.")
        for turn in episode.turns[1:]:
            turn.error = None
    return batch


def without_signal(batch):
    """Every rollout failed with the same reward, no feedback, no execution error, no privileged context."""
    batch = copy.deepcopy(batch)
    batch.rewards = torch.zeros(len(batch))
    for episode in batch.episodes:
        episode.success, episode.feedback = False, ""
        episode.task = dataclasses.replace(episode.task, privileged={})
        for turn in episode.turns:
            turn.error = None
    return batch


def other_tasks_experience():
    from experience_bank import Experience

    env = agentgym_opd.make(HOUSEHOLD, num_tasks=6)
    tasks = [env.get_task(t) for t in env.task_ids()[2:5]]
    return [Experience(t.env_id, t.id, t.instruction, [(a, "OK.") for a in t.privileged["walkthrough"]]) for t in tasks]


METHODS = {  # name -> (class, config, needs a separate teacher)
    "grpo": (GRPO, {}, False),
    "sdpo": (SDPO, {}, False),
    "sdpo_mixed": (SDPO, {"distill_weight": 0.5}, False),
    "opsd": (OPSD, {"top_m": 8}, False),
    "lopd": (LOPD, {"embedder": "hashing", "top_m": 8, "num_experiences": 1, "experience_max_tokens": 32,
                    "beta_init": 0.5}, False),
    "sage_opd": (SAGEOPD, {"judge": "errors_only", "default_label": "skip"}, True),
    "vpd": (VPD, {"feedback": "sibling", "e_updates": 1}, False),
}


def build(name, tmp_path):
    cls, config, needs_teacher = METHODS[name]
    student = HFPolicy.from_pretrained(default_tiny_model())
    teacher = perturbed_tiny_teacher(0.05, seed=5) if needs_teacher else None
    torch.manual_seed(11)
    optimizer = torch.optim.AdamW([p for p in student.model.parameters() if p.requires_grad], lr=LR,
                                  weight_decay=WEIGHT_DECAY)
    config = dict(config, bank_path=str(tmp_path / "bank")) if cls is LOPD else config
    return cls(dict(config), student, teacher, optimizer=optimizer, grad_clip=1.0, micro_batch_size=2)


def snapshot(algo) -> dict[str, torch.Tensor]:
    """Every tensor a skipped step must leave alone: the weights, AdamW's moments and step counts, an EMA or
    frozen teacher copy, LOPD's composer and dual variable."""
    out = {f"param.{n}": p.detach().clone() for n, p in algo.model.named_parameters()}
    for k, state in algo.optimizer.state_dict()["state"].items():
        out.update({f"adam.{k}.{n}": torch.as_tensor(v).clone() for n, v in state.items()})
    teacher = getattr(getattr(algo, "self_teacher", None), "copy", None)
    if teacher is not None:
        out.update({f"teacher.{n}": p.detach().clone() for n, p in teacher.named_parameters()})
    if hasattr(algo, "composer"):
        out.update({f"composer.{n}": p.detach().clone() for n, p in algo.composer.named_parameters()})
        out["beta"] = torch.tensor(algo.beta)
    return out


def assert_identical(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    moved = [name for name in before if not torch.equal(before[name], after[name])]
    assert not moved, f"{len(moved)} tensors moved, e.g. {moved[:3]}"


@pytest.mark.parametrize("name", list(METHODS))
def test_a_batch_without_signal_leaves_weights_and_optimiser_bit_identical(name, rollout, tmp_path):
    algo = build(name, tmp_path)
    if isinstance(algo, LOPD):
        algo.bank.add_many(other_tasks_experience())
    first = algo.update(with_signal(rollout))
    assert first[SKIPPED] == 0.0 and first["loss"] != 0.0  # a real step: AdamW's momentum is live now
    assert algo.optimizer.state_dict()["state"], "AdamW holds moments after the first step"
    if isinstance(algo, LOPD):  # an empty bank: every row masked
        for exp_id in algo.bank.store.ids().tolist():
            algo.bank.delete(exp_id)
    silent = without_signal(rollout)
    for micro in (1, len(silent)):
        algo.micro_batch_size = micro
        before = snapshot(algo)
        metrics = algo.update(silent)
        assert metrics[SKIPPED] == 1.0 and metrics["loss"] == 0.0
        assert_identical(before, snapshot(algo))


@pytest.mark.slow
def test_the_trainer_ticks_its_scheduler_only_after_an_optimiser_step(tmp_path):
    from agentgym_opd.config import load_config
    from agentgym_opd.trainer import Trainer

    config = load_config(None, ["algorithm=grpo", f"env={HOUSEHOLD}", "model.student=tiny", "model.device=cpu",
                                "train.steps=3", "train.warmup_steps=4", "rollout.tasks_per_step=1",
                                "rollout.group_size=2", "rollout.max_turns=2", "rollout.max_new_tokens=4",
                                "eval.every=0", f"output_dir={tmp_path}"])
    trainer = Trainer(config, env_overrides={"num_tasks": 2}, progress=False)
    trainer.algorithm.update = lambda batch: {"loss": 0.0, SKIPPED: 1.0}
    record = trainer.train_step()
    assert trainer.scheduler.last_epoch == 0 and record[SKIPPED] == 1.0
    trainer.algorithm.update = lambda batch: {"loss": 0.5, SKIPPED: 0.0}
    trainer.train_step()
    assert trainer.scheduler.last_epoch == 1


# ----------------------------------------------------------------------------------------------------
# Two ranks agree
# ----------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, batch_file: str, out_dir: str) -> None:
    """GRPO under DDP on this rank's shard: 'mixed' (only rank 1's group has signal) and 'silent' (neither)."""
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    ctx = D.init_distributed(timeout_s=120)
    batches = torch.load(batch_file, weights_only=False)
    results = {}
    for scenario, batch in batches.items():
        student = HFPolicy.from_pretrained(default_tiny_model())
        optimizer = torch.optim.AdamW(student.model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
        algo = D.distribute_algorithm(GRPO({}, student, optimizer=optimizer, micro_batch_size=1), "ddp", ctx)
        algo.dist = ctx
        metrics = algo.update(D.shard_batch(batch, ctx))
        state = D.full_state_dict(algo.model, ctx, rank0_only=False)
        results[scenario] = {"skipped": metrics[SKIPPED], "state": state,
                             "adam_steps": len(algo.optimizer.state_dict()["state"])}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    D.teardown(ctx)


@pytest.mark.slow
def test_two_ranks_agree_one_rank_with_signal_steps_both_and_none_skips_both(rollout, tmp_path):
    mixed = copy.deepcopy(rollout)
    mixed.rewards = torch.tensor([0.0, 0.0, 0.0, 1.0])  # rank 0's group: advantages 0; rank 1's: +-1
    silent = copy.deepcopy(rollout)
    silent.rewards = torch.zeros(4)
    torch.save({"mixed": mixed, "silent": silent}, tmp_path / "batches.pt")
    mp.spawn(_rank_main, args=(free_port(), str(tmp_path / "batches.pt"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    initial = HFPolicy.from_pretrained(default_tiny_model()).model.state_dict()
    for scenario, stepped in (("mixed", True), ("silent", False)):
        got = [r[scenario] for r in ranks]
        assert [g["skipped"] for g in got] == [0.0 if stepped else 1.0] * 2
        assert [g["adam_steps"] > 0 for g in got] == [stepped] * 2
        for name, value in got[0]["state"].items():
            assert torch.equal(value, got[1]["state"][name]), f"{scenario}: ranks disagree on {name}"
        moved = any(not torch.equal(v, initial[n]) for n, v in got[0]["state"].items() if n in initial)
        assert moved == stepped

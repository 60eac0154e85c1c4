"""After training, a bench job evaluates the trained student alone: the optimiser, gradients, teacher and training
envs are let go before its evaluation (a SmolLM2 worker's 2+ GB), and the policy it keeps still plays."""

from __future__ import annotations

import gc
import weakref

import pytest

from agentgym_opd.config import load_config
from agentgym_opd.playing import play_tasks
from agentgym_opd.trainer import Trainer
from evaluation.bench.training import release_freed_memory, trained_policy

HOUSEHOLD = "household/train"


@pytest.mark.slow  # a real (tiny) OPD step: seconds alone, minutes beside a busy machine
@pytest.mark.parametrize("autocast", ["none", "bfloat16"])
def test_the_trained_policy_outlives_the_trainer_and_nothing_else_of_training_does(tmp_path, autocast):
    """Under bf16 autocast the kept policy is also frozen with its projections stored in bf16 (as a frozen
    checkpoint is evaluated), and plays the same greedy actions as the trainer's own policy did."""
    import torch

    config = load_config(None, ["algorithm=opd", f"env={HOUSEHOLD}", "model.student=tiny", "model.teacher=tiny",
                                f"model.autocast={autocast}",
                                "model.device=cpu", "train.steps=1", "rollout.tasks_per_step=2",
                                "rollout.max_turns=2", "rollout.max_new_tokens=4", "eval.every=0",
                                f"output_dir={tmp_path}"])
    trainer = Trainer(config, env_overrides={"num_tasks": 2}, progress=False)
    trainer.train()
    assert trainer.algorithm.optimizer.state_dict()["state"], "a real step ran: AdamW holds moments"
    assert any(p.grad is not None for p in trainer.student.model.parameters())
    tasks = list(trainer.task_ids)
    before = play_tasks(trainer.eval_engine.policy, HOUSEHOLD, tasks, batch_size=2, max_context_tokens=512,
                        env_kwargs={"num_tasks": 2, "max_turns": 2})
    held = {name: weakref.ref(obj) for name, obj in [("optimizer", trainer.algorithm.optimizer),
                                                      ("teacher", trainer.teacher), ("env", trainer.envs[0]),
                                                      ("trainer", trainer)]}

    policy = trained_policy(trainer)
    assert all(p.grad is None for p in policy.model.parameters())
    linear_dtypes = {m.weight.dtype for m in policy.model.modules() if isinstance(m, torch.nn.Linear)}
    assert linear_dtypes == ({torch.float32} if autocast == "none" else {torch.bfloat16})
    assert any(p.requires_grad for p in policy.model.parameters()) == (autocast == "none")
    del trainer
    release_freed_memory()
    gc.collect()
    assert {name: ref() is None for name, ref in held.items()} == {name: True for name in held}

    after = play_tasks(policy, HOUSEHOLD, tasks, batch_size=2, max_context_tokens=512,
                       env_kwargs={"num_tasks": 2, "max_turns": 2})
    assert [[t.action for t in e.turns] for e in after] == [[t.action for t in e.turns] for e in before]

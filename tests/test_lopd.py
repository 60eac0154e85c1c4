"""LOPD on real rollouts of the tiny model: composer shapes and gradients, latent alignment, retrieval that
excludes the episode itself, the dual update, one real update, and a student-only checkpoint.

Retrieval here uses the HashingEmbedder (speed); the default run config uses all-MiniLM-L6-v2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentgym_opd.algorithm import sequence_logits
from algorithms.lopd import LOPD, dual_step, latent_teacher_logits
from experience_bank import Experience, trace_from_episode
from tiny_rollouts import HOUSEHOLD as ENV
from tiny_rollouts import tiny_household_rollout



@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    policy, batch = tiny_household_rollout(seed=11, max_turns=3, max_new_tokens=8)
    algo = LOPD({"embedder": "hashing", "bank_path": str(tmp_path_factory.mktemp("bank")), "num_experiences": 2,
                 "num_latents": 3, "top_m": 16}, policy, optimizer=torch.optim.AdamW(
                     [p for p in policy.model.parameters() if p.requires_grad], lr=1e-3))
    algo.remember(batch.episodes)  # seeds walkthroughs of both tasks
    algo.bank.add(Experience(ENV, "other", "put a mug in the fridge", [("open fridge 1", "The fridge is open.")]))
    return policy, batch, algo


def test_composer_emits_j_by_k_latents_of_embedding_width_and_gradients_reach_lora_and_queries(setup):
    policy, batch, algo = setup
    latents = algo.composer(batch.episodes[0].task.instruction, ["exp one > go", "exp two > take"])
    assert latents.shape == (2, 3, policy.model.get_input_embeddings().weight.shape[1])
    algo.optimizer.zero_grad(set_to_none=True)
    for p in algo.composer.parameters():
        p.grad = None
    loss, metrics = algo.compute_loss(batch, slice(0, len(batch)))
    loss.backward()
    lora = [p for n, p in algo.composer.named_parameters() if "lora_B" in n]
    assert lora and all(p.grad is not None for p in lora) and any(p.grad.abs().sum() > 0 for p in lora)
    assert algo.composer.compressor.queries.grad.abs().sum() > 0
    assert metrics["masked_fraction"] < 1.0


def test_latent_teacher_puts_student_token_t_at_t_plus_jk(setup):
    policy, batch, algo = setup
    rows = slice(0, 1)
    _, _, mask = sequence_logits(policy.model, batch, rows)
    width = mask.shape[1] + 1
    context = torch.randn(6, policy.model.get_input_embeddings().weight.shape[1])
    with torch.no_grad():
        aligned = latent_teacher_logits(algo.frozen_teacher, [context], batch, rows, width)
        length = int(batch.attention_mask[0].sum())
        embeds = torch.cat([context, algo.frozen_teacher.get_input_embeddings()(batch.input_ids[0, :length])])
        direct = algo.frozen_teacher(inputs_embeds=embeds[None]).logits.float()[0]
    agent = mask[0].bool()
    positions = torch.arange(width - 1)[agent]
    torch.testing.assert_close(aligned[0, positions], direct[positions + 6], atol=1e-4, rtol=1e-4)


def test_retrieval_excludes_the_episode_itself(setup):
    _, batch, algo = setup
    episode = batch.episodes[0]
    algo.bank.add(trace_from_episode(episode))
    own = trace_from_episode(episode).trace_hash()
    found = algo.retrieve(episode)
    assert found and all(e.trace_hash() != own for e in found)
    assert len(found) <= algo.config.num_experiences


def test_dual_update_matches_hand_computation(setup):
    _, batch, algo = setup
    assert dual_step(0.2, 0.1, -0.5, 0.05) == pytest.approx(0.2 + 0.05 * 0.6)
    assert dual_step(0.01, 0.1, 2.0, 0.05) == 0.0
    algo.beta, algo._gaps = 0.3, [(1.0, 2.0), (-0.4, 2.0)]  # mean gap 0.15
    algo.after_update()
    assert algo.beta == pytest.approx(max(0.0, 0.3 + algo.config.dual_lr * (algo.config.margin_value - 0.15)))


def test_one_real_update_moves_student_and_composer(setup):
    policy, batch, algo = setup
    for ep in batch.episodes[:1]:
        ep.success = True  # one success so the margin term is active on a real rollout
    before_student = [p.detach().clone() for p in policy.model.parameters() if p.requires_grad]
    before_queries = algo.composer.compressor.queries.detach().clone()
    algo.beta = 0.5
    metrics = algo.update(batch)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert "margin_gap" in metrics and "beta" in metrics
    after = [p.detach() for p in policy.model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before_student, after))
    assert not torch.equal(before_queries, algo.composer.compressor.queries.detach())
    state = algo.state_dict()["extra"]
    assert state["beta"] == algo.beta and any("queries" in k for k in state["composer"])


def test_cli_run_checkpoint_is_student_only(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agentgym_opd.cli", "train", "--algo", "lopd", "--env", ENV, "--student", "tiny",
           "model.device=cpu", "train.steps=2", "rollout.tasks_per_step=2", "rollout.max_turns=3",
           "rollout.max_new_tokens=8", "algo.embedder=hashing", "--env-arg", "num_tasks=4", "--output-dir", str(out)]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    model_dir = out / "checkpoints" / "step_2" / "model"
    names = " ".join(p.name for p in model_dir.iterdir())
    assert "safetensors" in names or "bin" in names
    from safetensors.torch import load_file

    weights = {k for f in model_dir.glob("*.safetensors") for k in load_file(f)}
    assert weights and not any("lora" in k or "queries" in k or "compressor" in k for k in weights)
    state = torch.load(out / "checkpoints" / "step_2" / "trainer_state.pt", weights_only=False)
    assert "composer" in state["algorithm"]["extra"] and "beta" in state["algorithm"]["extra"]
    assert (Path(out) / "metrics.jsonl").read_text().count("beta") == 2


def test_ablations_text_context_and_frozen_composer(setup, tmp_path):
    policy, batch, _ = setup
    text = LOPD({"embedder": "hashing", "bank_path": str(tmp_path / "t"), "context": "text", "train_composer": False,
                 "margin": False, "top_m": 16}, policy)
    text.remember(batch.episodes)
    assert len(text.optimizer.param_groups) == 1 and not text.composer.trainable_parameters()
    context = text.teacher_context(batch, 0)
    assert context and batch.episodes[0].task.privileged["walkthrough"][0] in context  # retrieved walkthrough, as text
    loss, metrics = text.compute_loss(batch, slice(0, len(batch)))
    loss.backward()
    assert torch.isfinite(loss) and metrics["masked_fraction"] < 1.0
    text.beta, text._gaps = 0.4, [(-5.0, 1.0)]
    text.after_update()
    assert text.beta == 0.4  # margin off: beta never moves

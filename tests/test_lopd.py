"""LOPD on real rollouts of the tiny model: composer shapes and gradients, latent alignment, retrieval that
excludes the episode itself, the dual update, one real update, and a student-only checkpoint.

Retrieval here uses the HashingEmbedder (speed); the default run config uses all-MiniLM-L6-v2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentgym_opd.algorithm import Step, sequence_logits
from algorithms.lopd import LOPD, dual_step, latent_teacher_hidden
from agentgym_opd.policy.hf import output_logits
from experience_bank import Experience, trace_from_episode
from tiny_rollouts import HOUSEHOLD as ENV
from tiny_rollouts import tiny_household_rollout



@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    policy, batch = tiny_household_rollout(seed=11, max_turns=3, max_new_tokens=8)
    algo = LOPD({"embedder": "hashing", "bank_path": str(tmp_path_factory.mktemp("bank")), "num_experiences": 2,
                 "num_latents": 3, "top_m": 16, "seed_walkthroughs": True}, policy, optimizer=torch.optim.AdamW(
                     [p for p in policy.model.parameters() if p.requires_grad], lr=1e-3))
    algo.remember(batch.episodes)  # seeds walkthroughs of both tasks
    algo.bank.add(Experience(ENV, "other", "put a mug in the fridge", [("open fridge 1", "The fridge is open.")]))
    return policy, batch, algo


@pytest.mark.slow
def test_composer_emits_j_by_k_latents_of_embedding_width_and_gradients_reach_lora_and_queries(setup):
    policy, batch, algo = setup
    latents = algo.composer(batch.episodes[0].task.instruction, ["exp one > go", "exp two > take"])
    assert latents.shape == (2, 3, policy.model.get_input_embeddings().weight.shape[1])
    algo.optimizer.zero_grad(set_to_none=True)
    for p in algo.composer.parameters():
        p.grad = None
    state = algo.prepare(batch)
    loss, metrics = algo.loss(batch, state)
    loss.backward()
    lora = [p for n, p in algo.composer.named_parameters() if "lora_B" in n]
    assert lora and all(p.grad is not None for p in lora) and any(p.grad.abs().sum() > 0 for p in lora)
    assert algo.composer.compressor.queries.grad.abs().sum() > 0
    assert state.metrics["masked_fraction"] < 1.0


@pytest.mark.slow
def test_latent_teacher_puts_student_token_t_at_t_plus_jk(setup):
    policy, batch, algo = setup
    rows = slice(0, 1)
    _, _, mask = sequence_logits(policy.model, batch, rows)
    width = mask.shape[1] + 1
    context = torch.randn(6, policy.model.get_input_embeddings().weight.shape[1])
    with torch.no_grad():
        aligned = output_logits(algo.frozen_teacher, latent_teacher_hidden(algo.frozen_teacher, [context], batch, rows, width))
        length = int(batch.attention_mask[0].sum())
        embeds = torch.cat([context, algo.frozen_teacher.get_input_embeddings()(batch.input_ids[0, :length])])
        direct = algo.frozen_teacher(inputs_embeds=embeds[None]).logits.float()[0]
    agent = mask[0].bool()
    positions = torch.arange(width - 1)[agent]
    torch.testing.assert_close(aligned[0, positions], direct[positions + 6], atol=1e-4, rtol=1e-4)


def test_retrieval_never_returns_an_experience_of_the_episodes_own_task(setup, tmp_path):
    """The episode's own trace, a sibling's success and the task's walkthrough all rank first (same instruction):
    none is retrieved, and the search widens past them to J experiences of other tasks."""
    policy, batch, _ = setup
    algo = LOPD({"embedder": "hashing", "bank_path": str(tmp_path / "b"), "num_experiences": 2, "top_m": 16,
                 "seed_walkthroughs": True}, policy)
    episode = batch.episodes[0]
    task = episode.task
    own_task = [trace_from_episode(episode), trace_from_episode(batch.episodes[1])]  # itself and its sibling
    own_task += [Experience(ENV, task.id, task.instruction, [(f"step {k}", "ok")]) for k in range(6)]
    algo.remember([episode])  # the task's walkthrough (seeding on)
    algo.bank.add_many(own_task)
    others = [Experience(ENV, f"other-{k}", f"put a mug in the fridge {k}", [("open fridge 1", "open")])
              for k in range(3)]
    algo.bank.add_many(others)
    assert all(e.task_id == task.id for e in algo.bank.retrieve(task, k=2, env_id=ENV))  # they do rank first
    found = algo.retrieve(episode)
    assert len(found) == 2 and all(e.task_id.startswith("other-") for e in found)
    only_own = LOPD({"embedder": "hashing", "bank_path": str(tmp_path / "own"), "top_m": 16}, policy)
    only_own.bank.add_many(own_task)
    assert only_own.retrieve(episode) == []  # nothing of another task: the row is masked, never handed its own task
    state = only_own.prepare(batch)
    assert [bool(f) for f in state.found] == [False, False, True, True]  # the other task's rows may use task 0's
    assert all(e.task_id == task.id for f in state.found[2:] for e in f)


class _Replay:
    """A rollout engine that hands back one prepared batch (the trainer's collect-then-update order, no sampling)."""

    def __init__(self, batch):
        self.batch = batch

    def collect(self, envs, tasks, *, group_size, seed):
        return self.batch


def test_a_batch_never_retrieves_its_own_episodes_and_banks_them_after_its_update(setup, tmp_path):
    """collect -> update as the trainer runs them: successes of both tasks are in the batch, yet the batch's
    retrieval sees an empty bank (every row masked); the successes are banked for the next batch."""
    policy, batch, _ = setup
    algo = LOPD({"embedder": "hashing", "bank_path": str(tmp_path / "b"), "top_m": 16}, policy)
    successes = {0, 3}  # one per task: each row's other task has a success in this batch
    for row, episode in enumerate(batch.episodes):
        episode.success = row in successes
    try:
        collected = algo.collect(_Replay(batch), [], [], group_size=2, seed=0)
        assert algo.bank.count() == 0
        seen = []
        prepare = algo.prepare
        algo.prepare = lambda b: seen.append(prepare(b)) or seen[-1]
        metrics = algo.update(collected)
        assert metrics["masked_fraction"] == 1.0 and all(not found for found in seen[0].found)
        banked = {e.trace_hash() for e in algo.bank.store.get(algo.bank.store.ids().tolist())}
        assert banked == {trace_from_episode(batch.episodes[r]).trace_hash() for r in successes}
        nxt = prepare(batch)  # the next batch of the same tasks: each row gets the OTHER task's success only
        assert all(f and all(e.task_id != ep.task.id for e in f) for f, ep in zip(nxt.found, batch.episodes))
    finally:
        for episode in batch.episodes:
            episode.success = False


def test_dual_update_matches_hand_computation(setup):
    _, batch, algo = setup
    assert dual_step(0.2, 0.1, -0.5, 0.05) == pytest.approx(0.2 + 0.05 * 0.6)
    assert dual_step(0.01, 0.1, 2.0, 0.05) == 0.0
    algo.beta = 0.3
    algo.after_update({"margin_gap": 0.15, "margin_weight": 1.0}, Step())
    assert algo.beta == pytest.approx(max(0.0, 0.3 + algo.config.dual_lr * (algo.config.margin_value - 0.15)))


@pytest.mark.slow
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


@pytest.mark.slow
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
                 "margin": False, "top_m": 16, "seed_walkthroughs": True}, policy)
    text.remember(batch.episodes)
    assert len(text.optimizer.param_groups) == 1 and not text.composer.trainable_parameters()
    state = text.prepare(batch)
    context = state.contexts[0]
    other = batch.episodes[2].task  # the batch's other task: its walkthrough is retrievable, row 0's own is not
    assert context and other.privileged["walkthrough"][0] in context  # retrieved walkthrough, as text
    loss, metrics = text.loss(batch, state)
    loss.backward()
    assert torch.isfinite(loss) and state.metrics["masked_fraction"] < 1.0
    text.beta = 0.4
    text.after_update({"margin_gap": -5.0, "margin_weight": 1.0}, Step())
    assert text.beta == 0.4  # margin off: beta never moves


@pytest.mark.parametrize("knob", [{"divergence": "forward_kl"}, {"estimator": "sampled"}, {"top_m_support": "teacher"},
                                  {"clip": 5.0}, {"jsd_beta": 0.9}])
def test_knobs_lopd_does_not_implement_are_refused_by_name(knob):
    from agentgym_opd.config import ConfigError, dataclass_from_dict
    from algorithms.lopd import LOPDConfig

    key = next(iter(knob))
    with pytest.raises((ConfigError, ValueError), match=f"algo.{key}"):
        dataclass_from_dict(LOPDConfig, knob, path="algo")


def test_bank_holds_successful_rollouts_only_by_default_and_experience_length_is_a_knob(setup, tmp_path):
    policy, batch, _ = setup
    algo = LOPD({"embedder": "hashing", "bank_path": str(tmp_path / "b"), "experience_max_tokens": 24}, policy)
    assert algo.composer.max_tokens == 24
    for ep in batch.episodes:
        ep.success = False
    algo.remember(batch.episodes)
    assert algo.bank.count() == 0  # no success: nothing banked, and no walkthrough either
    batch.episodes[1].success = True
    algo.remember(batch.episodes)
    stored = algo.bank.store.get(algo.bank.store.ids().tolist())
    assert len(stored) == 1 and stored[0].trace_hash() == trace_from_episode(batch.episodes[1]).trace_hash()
    batch.episodes[1].success = False


def test_bank_state_is_in_the_checkpoint_and_a_resume_rolls_it_back(setup, tmp_path):
    policy, batch, _ = setup
    algo = LOPD({"embedder": "hashing", "bank_path": str(tmp_path / "b")}, policy)
    algo.bank.add(Experience(ENV, "t1", "put a mug in the fridge", [("open fridge 1", "The fridge is open.")]))
    saved = algo.state_dict()
    algo.bank.add(Experience(ENV, "t2", "heat an egg", [("go to microwave 1", "You arrive.")]))  # after the checkpoint
    assert algo.bank.count() == 2
    algo.load_state_dict(saved)
    assert algo.bank.count() == 1 and algo.bank.store.get(algo.bank.store.ids().tolist())[0].task_id == "t1"
    fresh = LOPD({"embedder": "hashing", "bank_path": str(tmp_path / "elsewhere")}, policy)  # a resumed run's new bank
    fresh.load_state_dict(saved)
    assert fresh.bank.count() == 1


@pytest.mark.slow
def test_lora_student_builds_a_composer_and_trains_it(tmp_path):
    from agentgym_opd.policy.hf import HFPolicy, LoraConfig
    from agentgym_opd.policy.tiny import default_tiny_model

    policy, batch = tiny_household_rollout(seed=11, max_turns=2, max_new_tokens=6)
    student = HFPolicy.from_pretrained(default_tiny_model(), lora=LoraConfig(r=4, alpha=8))
    assert student.is_lora
    algo = LOPD({"embedder": "hashing", "bank_path": str(tmp_path / "b"), "top_m": 8, "seed_walkthroughs": True},
                student, optimizer=torch.optim.SGD([p for p in student.model.parameters() if p.requires_grad], lr=0.1))
    assert not any("lora" in n for n, _ in algo.frozen_teacher.named_parameters())  # the base, without the adapter
    assert any("lora" in n for n, _ in algo.composer.encoder.named_parameters())
    algo.remember(batch.episodes)
    queries = algo.composer.compressor.queries.detach().clone()
    metrics = algo.update(batch)
    assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["masked_fraction"] < 1.0
    assert not torch.equal(queries, algo.composer.compressor.queries.detach())


def test_a_bank_without_a_folder_is_scratch_and_deleted_with_its_algorithm(setup):
    """No bank_path and no run folder: the bank lives in a temporary folder that goes when the algorithm does."""
    import gc

    policy, batch, _ = setup
    algo = LOPD({"embedder": "hashing"}, policy)
    algo.bank.add(Experience(ENV, "t1", "put a mug in the fridge", [("open fridge 1", "The fridge is open.")]))
    folder = algo.bank.path
    assert folder.name.startswith("lopd_bank_") and any(folder.iterdir())
    del algo
    gc.collect()
    assert not folder.exists()

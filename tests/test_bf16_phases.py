"""bf16 autocast reaches all three phases of a training step (rollout decode, teacher scoring, the update) in
the code path the bench's SmolLM2 track runs: the Trainer with the track's own overrides (``model.autocast``
among them), a separate teacher, full weights or LoRA.

A forward hook on every projection (``nn.Linear``) of the student's and the teacher's bodies records the dtype
its product came out in, under the phase the trainer's meter had open at the time; the output head (whose
result the autocast hook casts back to float32) records whether autocast was on when it started. A phase that
ran a forward in float32 shows up as a float32 entry; the float32 run is the control that the probe sees it.
The tiny model stands in for SmolLM2 (same Llama architecture, built locally, seconds on a CPU).
"""

from __future__ import annotations

import contextlib
import json
from collections import defaultdict

import pytest
import torch

from agentgym_opd.profiling import PhaseMeter

PHASES = ("rollout", "teacher", "update")


def _autocast_dtype_now() -> torch.dtype | None:
    try:
        enabled = torch.is_autocast_enabled("cpu")
    except TypeError:  # older torch
        enabled = torch.is_autocast_cpu_enabled()
    if not enabled:
        return None
    try:
        return torch.get_autocast_dtype("cpu")
    except AttributeError:  # older torch
        return torch.get_autocast_cpu_dtype()


class PhaseProbe:
    """Which dtype each model's products ran in, per phase of the trainer's meter (innermost phase wins)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open: list[str] = []
        self.products: dict[tuple[str, str], set] = defaultdict(set)  # (phase, role) -> Linear output dtypes
        self.heads: dict[tuple[str, str], set] = defaultdict(set)  # (phase, role) -> autocast dtype at the head
        self.grads: dict[str, set] = defaultdict(set)  # phase -> dtypes of the gradients reaching projections
        original = PhaseMeter.phase
        probe = self

        @contextlib.contextmanager
        def tracked(meter: PhaseMeter, name: str):
            probe.open.append(name)
            try:
                with original(meter, name):
                    yield
            finally:
                probe.open.pop()

        monkeypatch.setattr(PhaseMeter, "phase", tracked)

    def current(self) -> str:
        return self.open[-1] if self.open else "outside"

    def watch(self, model: torch.nn.Module, role: str) -> None:
        head = model.get_output_embeddings()
        for module in model.get_decoder().modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_hook(
                    lambda m, a, out: self.products[(self.current(), role)].add(out.dtype))
                if role == "student":
                    module.register_full_backward_hook(
                        lambda m, gin, gout: self.grads[self.current()].update(g.dtype for g in gout if g is not None))
        head.register_forward_pre_hook(lambda m, a: self.heads[(self.current(), role)].add(_autocast_dtype_now()))


def _run_track_step(tmp_path, monkeypatch, *, autocast: str, lora_rank: int = 0,
                    teacher_autocast: str = "same") -> tuple[PhaseProbe, dict]:
    from agentgym_opd.config import load_config
    from agentgym_opd.trainer import Trainer, algorithm_class
    from evaluation.bench.tracks import SMOLLM2_ALFWORLD

    track = [o for o in SMOLLM2_ALFWORLD.overrides if not o.startswith("model.autocast=")]
    assert len(track) < len(SMOLLM2_ALFWORLD.overrides), "the SmolLM2 track no longer sets model.autocast"
    overrides = {"algorithm": "opd", "env": "household/train", "output_dir": str(tmp_path), "model.student": "tiny",
                 "model.teacher": "tiny", "model.device": "cpu", "model.autocast": autocast,
                 "model.lora_rank": lora_rank, "model.teacher_autocast": teacher_autocast, "train.steps": 1, "train.checkpoint_every": 0, "eval.every": 0,
                 "rollout.tasks_per_step": 2, "rollout.max_turns": 2, "rollout.max_new_tokens": 6}
    config = load_config(None, track + [f"{k}={v}" for k, v in overrides.items()],
                         algo_config_cls=algorithm_class("opd").Config)
    probe = PhaseProbe(monkeypatch)
    trainer = Trainer(config, env_overrides={"num_tasks": 4}, progress=False)
    probe.watch(trainer.student.model, "student")
    probe.watch(trainer.teacher.model, "teacher")
    trainer.train()
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    return probe, record


def _check_every_phase(probe: PhaseProbe, dtype: torch.dtype, head: torch.dtype | None) -> None:
    ran = {"rollout": "student", "teacher": "teacher", "update": "student"}  # whose body computes in each phase
    for phase, role in ran.items():
        assert probe.products[(phase, role)] == {dtype}, (phase, role, probe.products)
    for phase in ("rollout", "update"):
        assert probe.heads[(phase, "student")] == {head}, (phase, probe.heads)
    # the teacher's head runs chunk by chunk inside the loss (no [b, T, V] of teacher logits is kept), which the
    # meter counts as the update: wherever it ran, it ran under the same autocast
    teacher_heads = set().union(*(seen for (_, role), seen in probe.heads.items() if role == "teacher"))
    assert teacher_heads == {head}, probe.heads
    assert probe.grads["update"] == {dtype}, probe.grads
    # no forward of either model escaped the metered phases (or ran in another precision there)
    for (phase, role), seen in [*probe.products.items(), *probe.heads.items()]:
        assert phase in PHASES and seen <= {dtype, head}, (phase, role, seen)


@pytest.mark.slow
def test_the_track_runs_rollout_teacher_scoring_and_update_in_bf16(tmp_path, monkeypatch):
    probe, record = _run_track_step(tmp_path, monkeypatch, autocast="bfloat16")
    _check_every_phase(probe, torch.bfloat16, torch.bfloat16)
    assert record["agent_tokens"] > 0 and record["time/teacher_s"] > 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # the probe's hook on a frozen base projection
def test_with_lora_every_phase_is_bf16_too(tmp_path, monkeypatch):
    """LoRA wraps each projection (a frozen base Linear plus two small trainable ones): all of them in bf16."""
    probe, _ = _run_track_step(tmp_path, monkeypatch, autocast="bfloat16", lora_rank=4)
    _check_every_phase(probe, torch.bfloat16, torch.bfloat16)


@pytest.mark.slow
def test_the_probe_sees_float32_when_autocast_is_off(tmp_path, monkeypatch):
    """The control: with model.autocast=none the same probe records float32 in every phase."""
    probe, _ = _run_track_step(tmp_path, monkeypatch, autocast="none")
    _check_every_phase(probe, torch.float32, None)


@pytest.mark.slow
def test_a_bf16_teacher_scores_a_float32_student(tmp_path, monkeypatch):
    """model.teacher_autocast=bfloat16 with the student in float32: the teacher's body and head compute in bf16
    (its weights stored in bf16), the student's rollout and update stay float32, and the step trains."""
    probe, record = _run_track_step(tmp_path, monkeypatch, autocast="none", teacher_autocast="bfloat16")
    assert probe.products[("teacher", "teacher")] == {torch.bfloat16}, probe.products
    for phase in ("rollout", "update"):
        assert probe.products[(phase, "student")] == {torch.float32}, probe.products
        assert probe.heads[(phase, "student")] == {None}, probe.heads
    assert probe.grads["update"] == {torch.float32}, probe.grads
    assert record["agent_tokens"] > 0 and record["loss"] == record["loss"]  # a number, not NaN


def test_a_frozen_model_under_autocast_stores_its_projections_in_bf16_with_the_same_logits():
    """Autocast caches its bf16 casts only for weights that require grad: a frozen teacher or reference row would
    cast every weight again at every decoded token. Its projections are stored in bf16 instead; the products are
    the same numbers; what autocast runs in float32 (norms, the input embedding) stays float32, and a head tied to
    the embedding gets its own bf16 copy."""
    from agentgym_opd.config import ModelConfig
    from agentgym_opd.policy.loading import load_student
    from agentgym_opd.policy.precision import enable_autocast, store_frozen_projections

    frozen = load_student("tiny", ModelConfig(autocast="bfloat16"), trainable=False)
    reference = load_student("tiny", ModelConfig(), trainable=False).model
    enable_autocast(reference, "bfloat16")  # the same autocast, float32 storage
    projections = [m for m in frozen.model.get_decoder().modules() if isinstance(m, torch.nn.Linear)]
    assert projections and all(m.weight.dtype == torch.bfloat16 for m in projections)
    head, embed = frozen.model.get_output_embeddings(), frozen.model.get_input_embeddings()
    assert reference.get_output_embeddings().weight is reference.get_input_embeddings().weight  # tied in tiny
    assert head.weight.dtype == torch.bfloat16 and embed.weight.dtype == torch.float32  # the head's own copy
    assert torch.equal(head.weight, embed.weight.to(torch.bfloat16))
    norms = [p for n, p in frozen.model.named_parameters() if "norm" in n]
    assert norms and all(p.dtype == torch.float32 for p in norms)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        assert torch.equal(frozen.model(input_ids=ids).logits, reference(input_ids=ids).logits)
    trainable = load_student("tiny", ModelConfig(autocast="bfloat16"), trainable=True)
    with pytest.raises(ValueError, match="trainable parameters"):
        store_frozen_projections(trainable.model)
    assert all(p.dtype == torch.float32 for p in trainable.model.parameters())


def test_a_chunked_output_head_casts_its_weight_once_forward_and_once_backward():
    """The chunked head (log-probs and losses over the vocabulary, a chunk of positions at a time) runs its chunks
    in one autocast context: the [V, H] weight is cast to bf16 once per pass, not once per chunk (SmolLM2's 28M-
    element head was cast ~22 times forward and 22 times backward per micro-batch: a sixth of a bf16 update), and
    the gradients agree with the one-chunk computation's to bf16's rounding."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from agentgym_opd.algorithm import token_logprobs_of
    from agentgym_opd.config import ModelConfig
    from agentgym_opd.policy.loading import load_student

    model = load_student("tiny", ModelConfig(autocast="bfloat16"), trainable=True).model
    shape = tuple(model.get_output_embeddings().weight.shape)

    class HeadCasts(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket is torch.ops.aten._to_copy and tuple(out.shape) == shape \
                    and out.dtype == torch.bfloat16:
                self.count += 1
            return out

    ids = torch.randint(3, 100, (2, 40))
    attention = torch.ones_like(ids)
    grads = []
    for chunk, expected in ((5, 2), (10_000, 2)):  # 8 chunks or one: the same casts, the same gradients
        model.zero_grad()
        with HeadCasts() as casts:
            token_logprobs_of(model, ids, attention, chunk=chunk).sum().backward()
        assert casts.count == expected, (chunk, casts.count)
        grads.append(model.get_output_embeddings().weight.grad.clone())
    # each chunk's weight gradient comes out of a bf16 product (rounded to 8 bits of mantissa) before the float32
    # sum: chunkings differ by that rounding, not more
    assert float((grads[0] - grads[1]).norm() / grads[1].norm()) < 1e-2

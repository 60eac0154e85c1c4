"""Peak memory of one OPD update step (teacher scoring + loss + backward): today's full logits vs chunks.

A Qwen-sized vocabulary (151,936 tokens) on a small random body, one sequence of T tokens (default 2048)
with the loss on every position after a 256-token prompt, OPD's divergence with top-M=64 + tail. Today's
step materialises the teacher's and the student's ``[b, T, V]`` float32 logits (`aligned_teacher_logits`
as it was, frozen below, and `sequence_logits`); the new step keeps the teacher's final hidden states and
makes logits one chunk of positions at a time (`chunked_distillation_terms`). Memory is counted exactly,
as the peak bytes of tensors created during the step (`_memory.PeakTensorBytes`: the weights excluded),
in one process; the loss of both steps is printed with their difference.

    python benchmarks/bench_teacher_memory.py [--tokens 2048] [--vocab 151936] [--top-m 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from agentgym_opd.distill import (DistillConfig, TeacherInputs, aligned_teacher_hidden, chunked_distillation_terms,
                                  distillation_per_token, reverse_kl_per_token)
from agentgym_opd.losses import aggregate_token_loss, token_logprobs
from agentgym_opd.policy.hf import chunk_positions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _memory import PeakTensorBytes  # noqa: E402

PROMPT = 256


def small_body(vocab: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
                         max_position_embeddings=8192)
    return LlamaForCausalLM(config).eval()


def todays_teacher_logits(model, inputs: TeacherInputs, width: int) -> torch.Tensor:
    """`distill.aligned_teacher_logits` before this change (frozen): full logits, then a gathered copy."""
    with torch.no_grad():
        logits = model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask, use_cache=False).logits.float()
    index = torch.arange(width - 1)[None, :] + inputs.offsets[:, None]
    index = index.clamp(0, logits.shape[1] - 1)
    return logits.gather(1, index[..., None].expand(-1, -1, logits.shape[-1]))


def todays_step(student, teacher, ids, mask, config) -> float:
    inputs = TeacherInputs(ids, torch.ones_like(ids), torch.zeros(ids.shape[0], dtype=torch.long))
    logits = student(input_ids=ids, use_cache=False).logits.float()[:, :-1]  # algorithm.sequence_logits
    teacher_logits = todays_teacher_logits(teacher, inputs, ids.shape[1])
    per_token = distillation_per_token(logits, teacher_logits, ids[:, 1:], mask, config)
    loss = aggregate_token_loss(per_token, mask, config.aggregation)
    reverse_kl_per_token(logits, teacher_logits, mask)  # the logged kl
    token_logprobs(logits, ids[:, 1:])
    loss.backward()
    return float(loss.detach())


def chunked_step(student, teacher, ids, mask, config) -> float:
    inputs = TeacherInputs(ids, torch.ones_like(ids), torch.zeros(ids.shape[0], dtype=torch.long))
    aligned = aligned_teacher_hidden(teacher, inputs, ids.shape[1])
    terms = chunked_distillation_terms(student, ids, torch.ones_like(ids), mask, aligned, config)
    loss = aggregate_token_loss(terms.per_token, terms.mask, config.aggregation)
    loss.backward()
    return float(loss.detach())


def teacher_side(student, teacher, ids) -> tuple[int, int]:
    """Peak bytes of the teacher's part alone: today's scoring call (whose [b, T, V] result the loss then
    holds) vs the hidden-state pass plus one chunk's logits and log-softmax (all the teacher ever holds)."""
    inputs = TeacherInputs(ids, torch.ones_like(ids), torch.zeros(ids.shape[0], dtype=torch.long))
    with PeakTensorBytes() as today:
        todays_teacher_logits(teacher, inputs, ids.shape[1])
    with PeakTensorBytes() as hidden_pass:
        aligned = aligned_teacher_hidden(teacher, inputs, ids.shape[1])
    step = chunk_positions(ids.shape[0], teacher.config.vocab_size)
    with PeakTensorBytes() as one_chunk:
        torch.log_softmax(aligned.logits(0, step), dim=-1)
    hidden_bytes = aligned.hidden.untyped_storage().nbytes()
    return today.peak, max(hidden_pass.peak, hidden_bytes + one_chunk.peak)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--top-m", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    student, teacher = small_body(args.vocab, 0), small_body(args.vocab, 1)
    teacher.requires_grad_(False)
    torch.manual_seed(2)
    ids = torch.randint(0, args.vocab, (1, args.tokens))
    mask = torch.zeros(1, args.tokens - 1)
    mask[:, PROMPT:] = 1.0
    config = DistillConfig(top_m=args.top_m)  # OPD: reverse KL, student's top-M support, tail bucket

    t_today, t_new = teacher_side(student, teacher, ids)
    with PeakTensorBytes() as new:
        new_loss = chunked_step(student, teacher, ids, mask, config)
    new_grad = [p.grad.clone() for p in student.parameters()]
    student.zero_grad()
    with PeakTensorBytes() as today:
        today_loss = todays_step(student, teacher, ids, mask, config)
    grad_diff = max(float((p.grad - g).abs().max()) for p, g in zip(student.parameters(), new_grad))
    mb = 1 / 2**20
    print(f"V={args.vocab}, T={args.tokens}, top-M={args.top_m} + tail, body hidden 64 x 1 layer, "
          f"chunk {chunk_positions(1, args.vocab)} positions")
    print(f"{'':>28} {'today MiB':>10} {'chunked MiB':>12} {'ratio':>8}")
    print(f"{'teacher side':>28} {t_today * mb:>10.1f} {t_new * mb:>12.1f} {t_today / t_new:>7.1f}x")
    print(f"{'whole step (loss+backward)':>28} {today.peak * mb:>10.1f} {new.peak * mb:>12.1f} {today.peak / new.peak:>7.1f}x")
    print(f"loss today {today_loss:.8f}  chunked {new_loss:.8f}  |diff| {abs(today_loss - new_loss):.2e}  "
          f"max |grad diff| {grad_diff:.2e}")


if __name__ == "__main__":
    main()

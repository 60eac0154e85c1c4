"""Peak memory and time of the top-M + tail reverse-KL loss against the full-vocabulary loss.

What is measured, honestly:
- ``teacher MB``: bytes of the teacher's side as the loss receives it. Full vocabulary: ``[N, V]`` logits.
  Top-M: a :class:`~agentgym_opd.losses.TopM` record, i.e. M+1 float values per token (M log-probs and
  the tail) plus the M int64 token ids. This is the number the design's memory claim is about.
- ``peak MB``: the rise of the process's peak resident set size during one forward + backward of the
  loss: the kernel's peak mark (VmHWM) is reset once all inputs (student logits, teacher side) exist,
  and read after ``backward()``. Each configuration runs in its own fresh subprocess. This includes the
  student's logits gradient ``[N, V]`` (``grad MB``; every method pays it) and allocator overheads; it
  is RSS, not a per-tensor account.
- ``ms``: median wall time of forward + backward, all configurations timed in this one process (so the
  ratios compare like with like on a shared machine). Ratios are full / top-M (> 1 means top-M wins).

Usage: ``python benchmarks/bench_losses.py [--tokens 2048] [--vocab 150000] [--m 20,50,100]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentgym_opd import losses as L  # noqa: E402

CHUNK_ROWS = 128


def _teacher_record(tokens: int, vocab: int, m: int, support: str, student_logits: torch.Tensor, seed: int) -> L.TopM:
    """Build the teacher's M+1 numbers chunk by chunk, as a teacher server would, never holding [N, V]."""
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for start in range(0, tokens, CHUNK_ROWS):
        rows = min(CHUNK_ROWS, tokens - start)
        teacher_chunk = torch.randn(1, rows, vocab, generator=gen) * 2.0
        if support == "student":
            ids = L.student_topm_ids(student_logits[:, start : start + rows], m)
            parts.append(L.gather_topm(teacher_chunk, ids))
        else:
            parts.append(L.teacher_topm(teacher_chunk, m))
        del teacher_chunk
    return L.TopM(
        ids=torch.cat([p.ids for p in parts], dim=1),
        logprobs=torch.cat([p.logprobs for p in parts], dim=1),
        tail=torch.cat([p.tail for p in parts], dim=1),
    )


def _inputs(mode: str, tokens: int, vocab: int, m: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    student = (torch.randn(1, tokens, vocab, generator=gen)).requires_grad_()
    mask = torch.ones(1, tokens, dtype=torch.bool)
    if mode == "full":
        teacher = torch.randn(1, tokens, vocab, generator=gen) * 2.0
        teacher_bytes = teacher.numel() * teacher.element_size()
    else:
        teacher = _teacher_record(tokens, vocab, m, mode.split("-")[1], student.detach(), seed + 1)
        teacher_bytes = sum(t.numel() * t.element_size() for t in (teacher.ids, teacher.logprobs, teacher.tail))
    return student, teacher, mask, teacher_bytes


def _loss(mode: str, student: torch.Tensor, teacher, mask: torch.Tensor) -> torch.Tensor:
    if mode == "full":
        per_token = L.full_vocab_divergence(student, teacher, mask, "reverse_kl")
    else:
        per_token = L.topm_divergence(student, teacher, mask, "reverse_kl", tail=True)
    return L.aggregate_token_loss(per_token, mask, "token_mean")


def _proc_status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0  # kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS, so the peak measured next is the
    loss's own and not left over from building the inputs (Linux >= 4.0: write 5 to clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def measure_peak(mode: str, tokens: int, vocab: int, m: int) -> dict:
    """Run in a fresh process: peak RSS rise of one forward + backward over the inputs' baseline."""
    student, teacher, mask, teacher_bytes = _inputs(mode, tokens, vocab, m)
    _reset_peak_rss()
    baseline = _proc_status_mb("VmRSS")
    _loss(mode, student, teacher, mask).backward()
    peak = _proc_status_mb("VmHWM")
    grad_mb = student.grad.numel() * student.grad.element_size() / 2**20
    return {"peak_mb": peak - baseline, "teacher_mb": teacher_bytes / 2**20, "grad_mb": grad_mb}


def measure_time(mode: str, tokens: int, vocab: int, m: int, reps: int) -> float:
    student, teacher, mask, _ = _inputs(mode, tokens, vocab, m)
    times = []
    for _ in range(reps + 1):  # first run warms up
        student.grad = None
        start = time.perf_counter()
        _loss(mode, student, teacher, mask).backward()
        times.append(time.perf_counter() - start)
    del student, teacher
    return statistics.median(times[1:]) * 1000.0


def _extra(row: dict) -> float:
    return max(row["peak_mb"] - row["grad_mb"], 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048, help="B*T tokens in the batch")
    parser.add_argument("--vocab", type=int, default=150_000)
    parser.add_argument("--m", default="20,50,100", help="comma-separated top-M sizes")
    parser.add_argument("--supports", default="student,teacher", help="top-M support(s): student, teacher")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the build machine is shared)")
    parser.add_argument("--_peak", nargs=2, metavar=("MODE", "M"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    if args._peak:
        print(json.dumps(measure_peak(args._peak[0], args.tokens, args.vocab, int(args._peak[1]))))
        return

    sizes = [int(x) for x in args.m.split(",")]
    configs = [("full", 0)] + [(f"topm-{s}", m) for s in args.supports.split(",") for m in sizes]
    rows = {}
    for mode, m in configs:
        out = subprocess.run(
            [sys.executable, __file__, "--tokens", str(args.tokens), "--vocab", str(args.vocab),
             "--threads", str(args.threads), "--_peak", mode, str(m)],
            check=True, capture_output=True, text=True,
        )
        rows[(mode, m)] = json.loads(out.stdout.strip().splitlines()[-1])
    for mode, m in configs:
        rows[(mode, m)]["ms"] = measure_time(mode, args.tokens, args.vocab, m, args.reps)

    full = rows[("full", 0)]
    print(f"reverse KL, {args.tokens} tokens, vocabulary {args.vocab}, float32, "
          f"torch {torch.__version__}, {args.threads} thread(s)")
    print(f"teacher values per token: full = {args.vocab}; top-M = M+1 (plus M int64 ids)")
    print(f"student logits gradient (paid by every variant): {full['grad_mb']:.1f} MB")
    header = (f"{'loss':<16}{'M':>5}{'teacher MB':>12}{'peak MB':>10}{'extra MB':>10}{'ms':>10}"
              f"{'teacher x':>11}{'peak x':>9}{'extra x':>9}{'time x':>9}")
    print(header)
    print("-" * len(header))
    for mode, m in configs:
        row = rows[(mode, m)]
        print(
            f"{mode:<16}{m if m else '-':>5}{row['teacher_mb']:>12.1f}{row['peak_mb']:>10.1f}{_extra(row):>10.1f}{row['ms']:>10.1f}"
            f"{full['teacher_mb'] / row['teacher_mb']:>11.1f}"
            f"{full['peak_mb'] / max(row['peak_mb'], 1e-9):>9.2f}"
            f"{_extra(full) / max(_extra(row), 1e-9):>9.2f}"
            f"{full['ms'] / row['ms']:>9.2f}"
        )
    print("extra MB = peak MB - the logits gradient: what the loss itself costs on top of backprop.")
    print("x columns: full-vocabulary value / this row's value (memory and time saved by top-M).")
    print("peak MB includes the student's logits gradient; teacher MB counts M+1 float32 values and M int64 ids.")


if __name__ == "__main__":
    main()

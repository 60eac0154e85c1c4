"""Build the SmolLM2 ALFWorld pair on its own (`alfworld_pair`), both models side by side, with bars and ETAs.

    python -m evaluation.bench.alfworld_pair_command            # student here, teacher in a second process
    python -m evaluation.bench.alfworld_pair_command teacher    # one model

`agentgym-opd bench --track smollm2-alfworld` builds the same pair as its first two jobs; this command is for
building (or resuming) it apart from the track, e.g. to time the build against its two-hour budget.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from evaluation.bench.alfworld_pair import (STUDENT_SPEC, TEACHER_SPEC, AlfworldPairSpec, build_pair_model,
                                            cache_root, cached_pair_model, recorded_train_games)


def main(argv: list[str] | None = None) -> int:
    """Build the track's pair (one torch thread per model; ``both`` builds the teacher in a second process beside
    the student). Killed, the same command resumes each build from its last checkpoint."""
    import argparse
    import subprocess
    import sys

    import torch

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("which", nargs="?", default="both", choices=["both", "student", "teacher"])
    parser.add_argument("--progress-file", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    specs = {"student": STUDENT_SPEC, "teacher": TEACHER_SPEC}
    if args.which != "both":
        print(build_pair_model(specs[args.which], progress=args.progress_file is None, progress_file=args.progress_file))
        return 0
    recorded_train_games(STUDENT_SPEC)  # once, before the two builds share it
    follow = cache_root() / "alfworld-teacher.progress"
    follow.unlink(missing_ok=True)
    teacher = subprocess.Popen([sys.executable, "-m", "evaluation.bench.alfworld_pair_command", "teacher",
                                "--progress-file", str(follow)])
    student = build_pair_model(STUDENT_SPEC)
    _follow_build(teacher, follow, TEACHER_SPEC)
    if teacher.returncode != 0:
        print(f"the teacher's build failed (exit {teacher.returncode}); rerun to resume it", file=sys.stderr)
        return 1
    print(f"student: {student}\nteacher: {cached_pair_model(TEACHER_SPEC)}")
    return 0


def _follow_build(proc: Any, progress_file: Path, spec: AlfworldPairSpec) -> None:
    """A bar with an ETA for a build running in another process (it writes its steps done to ``progress_file``)."""
    from tqdm import tqdm

    with tqdm(total=spec.steps, desc=f"alfworld {spec.name} (other process)", unit="step") as bar:
        while proc.poll() is None:
            try:
                bar.n = int(progress_file.read_text().strip() or 0)
                bar.refresh()
            except (OSError, ValueError):
                pass
            time.sleep(2.0)


if __name__ == "__main__":
    raise SystemExit(main())

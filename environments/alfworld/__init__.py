"""ALFWorld (Shridhar et al., 2021): household tasks as TextWorld games, played through TextWorld.

Ids: `alfworld/train`, `alfworld/valid_seen`, `alfworld/valid_unseen`, and per task type
`alfworld/<split>-<type>` with type one of `TASK_TYPES` (e.g. `alfworld/valid_unseen-pick_heat_then_place`; gymnasium ids allow one slash);
`task_types=` on any id filters the same way. Import-light: TextWorld and alfworld load when an env is built.
"""

SPLITS = ("train", "valid_seen", "valid_unseen")
# short name used in ids -> ALFWorld's own task-type prefix of the game folder names
TASK_TYPES = {
    "pick_and_place": "pick_and_place_simple",
    "look_at_obj_in_light": "look_at_obj_in_light",
    "pick_clean_then_place": "pick_clean_then_place_in_recep",
    "pick_heat_then_place": "pick_heat_then_place_in_recep",
    "pick_cool_then_place": "pick_cool_then_place_in_recep",
    "pick_two_obj": "pick_two_obj_and_place",
}


def register_envs() -> None:
    from agentgym_opd.action_parsing import ONE_ACTION_PROMPT
    from agentgym_opd.registry import register

    entry = "environments.alfworld.env:AlfWorldEnv"
    for split in SPLITS:
        register(f"alfworld/{split}", entry_point=entry, action_parser="text", system_prompt=ONE_ACTION_PROMPT, description=f"ALFWorld {split} games (all six task types)",
                 split=split)
        for short in TASK_TYPES:
            register(f"alfworld/{split}-{short}", entry_point=entry, action_parser="text", system_prompt=ONE_ACTION_PROMPT,
                     description=f"ALFWorld {split} games of task type {TASK_TYPES[short]}",
                     split=split, task_types=(short,))

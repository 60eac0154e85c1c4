"""ScienceWorld (Wang et al., 2022): 30 elementary-science tasks in a text simulator (a JVM behind py4j).

Ids: `scienceworld/<task-name>` for each of the 30 tasks (e.g. `scienceworld/boil`,
`scienceworld/find-living-thing`); `split=` picks the task's train / dev / test variations (the
benchmark's own folds). Import-light: the JVM starts only when an env is built.
"""

TASK_NAMES = (
    "boil", "change-the-state-of-matter-of", "chemistry-mix", "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color", "find-animal", "find-living-thing", "find-non-living-thing",
    "find-plant", "freeze", "grow-fruit", "grow-plant", "identify-life-stages-1", "identify-life-stages-2",
    "inclined-plane-determine-angle", "inclined-plane-friction-named-surfaces",
    "inclined-plane-friction-unnamed-surfaces", "lifespan-longest-lived", "lifespan-longest-lived-then-shortest-lived",
    "lifespan-shortest-lived", "measure-melting-point-known-substance", "measure-melting-point-unknown-substance",
    "melt", "mendelian-genetics-known-plant", "mendelian-genetics-unknown-plant", "power-component",
    "power-component-renewable-vs-nonrenewable-energy", "test-conductivity", "test-conductivity-of-unknown-substances",
    "use-thermometer",
)


def register_envs() -> None:
    from agentgym_opd.action_parsing import ONE_ACTION_PROMPT
    from agentgym_opd.registry import register

    for name in TASK_NAMES:
        register(
            f"scienceworld/{name}",
            entry_point="environments.scienceworld.env:ScienceWorldTextEnv",
            description=f"ScienceWorld task '{name}' (train/dev/test variations), score 0-100, gold path privileged",
            task_name=name,
            action_parser="text",
            system_prompt=ONE_ACTION_PROMPT,
        )

"""TextWorldExpress (Jansen & Côté, 2022): fast simulated text games, one id per game.

Ids: `textworld_express/<game>` for twc, cookingworld, coin, mapreader, arithmetic, sorting, simonsays,
peckingorder; `split=` is train/dev/test (the engine's own seed folds). Registration stays import-light:
the engine (a JVM behind py4j) starts only when an env is built.
"""

GAMES = ("twc", "cookingworld", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")


def register_envs() -> None:
    from agentgym_opd.action_parsing import ONE_ACTION_PROMPT
    from agentgym_opd.registry import register

    for game in GAMES:
        register(
            f"textworld_express/{game}",
            entry_point="environments.textworld_express.env:TextWorldExpressTextEnv",
            description=f"TextWorldExpress '{game}' games (train/dev/test seed folds), gold path as privileged",
            game=game,
            action_parser="text",
            system_prompt=ONE_ACTION_PROMPT,
        )

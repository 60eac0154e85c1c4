"""Household world: env contract, bad input, admissible actions, splits, exact planner, feedback."""

from __future__ import annotations

import itertools
import random

import pytest
from gymnasium.utils.env_checker import check_env

from agentgym_opd.core import EnvMisuseError, UnknownTaskError
from agentgym_opd.registry import list_envs, make
from environments.household.commands import COMMAND_HELP, resolve
from environments.household.env import HouseholdEnv
from environments.household.generator import GoalDraw, is_unseen_combination, split_combinations
from environments.household.goals import TASK_TYPES, Goal, GoalChecker
from environments.household.planner import all_commands, bfs, plan, relevant_expander
from environments.household.scenes import CLEAN, COOL, HOT, LAMP
from environments.household.world import World

SPLITS = ("train", "valid_seen", "valid_unseen")


@pytest.fixture(scope="module")
def envs() -> dict[str, HouseholdEnv]:
    return {s: HouseholdEnv(s) for s in SPLITS}


def _task_of_type(env: HouseholdEnv, task_type: str, nth: int = 0):
    ids = [i for i in env.task_ids() if i.split(":")[2] == task_type]
    return env.get_task(ids[nth])


# ---------------------------------------------------------------- contract
@pytest.mark.parametrize("split", SPLITS)
def test_check_env_passes(split):
    env = make(f"household/{split}")
    check_env(env.unwrapped, skip_render_check=True)


def test_registered_ids_and_defaults():
    ids = [s.id for s in list_envs() if s.id.startswith("household/")]
    assert len(ids) == 3 + 3 * 6
    env = make("household/valid_unseen")
    assert env.env_id == "household/valid_unseen" and len(env.task_ids()) == 200
    assert len(make("household/train").task_ids()) == 2000
    heat = make("household/valid_unseen-pick_heat_then_place")
    assert heat.task_ids() and all(":pick_heat_then_place:" in i for i in heat.task_ids())
    assert set(heat.task_ids()) <= set(env.task_ids())
    small = make("household/train", num_tasks=12, task_types=["pick_two_obj_and_place"], max_turns=7)
    assert len(small.task_ids()) == 2 and small.max_turns == 7
    with pytest.raises(ValueError):
        HouseholdEnv("test")
    with pytest.raises(ValueError):
        HouseholdEnv("train", task_types=["boil_water"])


def test_every_split_has_all_six_task_types(envs):
    for env in envs.values():
        types = {i.split(":")[2] for i in env.task_ids()}
        assert types == set(TASK_TYPES)


def test_determinism_same_seed_same_task_and_observations():
    a, b = HouseholdEnv("train"), HouseholdEnv("train")
    obs_a, info_a = a.reset(seed=123)
    obs_b, info_b = b.reset(seed=123)
    assert obs_a == obs_b and info_a["task"] == info_b["task"]
    rng_a, rng_b = random.Random(5), random.Random(5)
    for _ in range(20):
        act_a = rng_a.choice(info_a["admissible_actions"])
        act_b = rng_b.choice(info_b["admissible_actions"])
        out_a, out_b = a.step(act_a), b.step(act_b)
        assert out_a[:4] == out_b[:4] and out_a[4]["admissible_actions"] == out_b[4]["admissible_actions"]
        info_a, info_b = out_a[4], out_b[4]
        if out_a[2] or out_a[3]:
            break
    seen = {HouseholdEnv("train").reset(seed=s)[1]["task"].id for s in range(8)}
    assert len(seen) > 1  # the seed does pick the task


def test_initial_observation_is_alfworld_style_and_partial(envs):
    env = envs["valid_seen"]
    task = _task_of_type(env, "pick_clean_then_place")
    obs, info = env.reset(options={"task_id": task.id})
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert "You are in the middle of a room. Looking quickly around you, you see a " in obs
    assert obs.endswith(f"Your task is to: {task.instruction}\n\n{COMMAND_HELP}")
    assert "Admissible actions:" not in obs  # only with show_admissible=True
    assert "clean" in task.instruction
    # objects are not visible from the middle of the room
    assert not any(o in obs for o in env.world.o_names)
    world = env.world
    closed = next(i for i, name in enumerate(world.r_names) if world.r_openable[i] and not world.r_open[i])
    obs, *_ = env.step(f"go to {world.r_names[closed]}")
    neighbour = world.r_names[(closed + 1) % len(world.r_names)]
    assert obs == f"You arrive at {world.r_names[closed]}. The {world.r_names[closed]} is closed. Next to it, you see the {neighbour}."
    obs, *_ = env.step(f"open {world.r_names[closed]}")
    assert obs.startswith(f"You open the {world.r_names[closed]}. The {world.r_names[closed]} is open. In it, you see ")
    assert env.step("inventory")[0] == "You are not carrying anything."


# ---------------------------------------------------------------- bad input
def test_bad_input_becomes_errors_and_env_keeps_working(envs):
    env = envs["train"]
    env.reset(seed=3)
    cases = [
        ("", "parse_error"),
        ("   ", "parse_error"),
        ("x" * 10_000, "parse_error"),
        ("\udcff\x00", "parse_error"),
        ("take apple 99 from fridge 1", "invalid_action"),
        ("put mug 1 in/on cabinet 1", "invalid_action"),
        ("fly to the moon", "invalid_action"),
        ("go to narnia 1", "invalid_action"),
    ]
    for action, kind in cases:
        obs, reward, terminated, truncated, info = env.step(action)
        assert info["error"] is not None and info["error"].kind == kind, (action, info["error"])
        assert info["error"].message and obs and reward == 0.0 and not terminated
        if kind == "invalid_action":
            assert obs.startswith("Nothing happens.") and "admissible_actions" in info["error"].message
        valid = info["admissible_actions"][0]
        _, _, _, _, info = env.step(valid)
        assert info["error"] is None
    assert len(env.error_log) == len(cases)


def test_invalid_action_messages_say_why(envs):
    env = envs["valid_seen"]
    task = _task_of_type(env, "pick_heat_then_place")
    env.reset(options={"task_id": task.id})
    world = env.world
    micro = next(n for n in world.r_names if n.startswith("microwave"))
    obj = task.metadata["object_type"] + " 1"
    info = env.step(f"heat {obj} with {micro}")[4]
    assert "holding" in info["error"].message
    info = env.step(f"open {micro}")[4]
    assert "go to" in info["error"].message
    info = env.step(f"heat {obj} with {world.r_names[0]}")[4]
    assert "microwave" in info["error"].message


def test_misuse_raises(envs):
    env = HouseholdEnv("valid_unseen", num_tasks=6, max_turns=2)
    with pytest.raises(EnvMisuseError):
        env.step("look")
    with pytest.raises(UnknownTaskError):
        env.reset(options={"task_id": "valid_unseen:9999:pick_and_place:apple:countertop_1"})
    with pytest.raises(UnknownTaskError):
        env.get_task(envs["train"].task_ids()[0])  # another split's id
    env.reset(seed=0)
    env.step("look")
    *_, truncated, _ = env.step("look")
    assert truncated
    with pytest.raises(EnvMisuseError):
        env.step("look")


def test_truncation_at_max_turns():
    env = HouseholdEnv("train", max_turns=4)
    env.reset(seed=1)
    for turn in range(1, 5):
        obs, reward, terminated, truncated, info = env.step("inventory")
        assert info["turn"] == turn and not terminated and truncated == (turn == 4)
    assert "Ran out of turns" in info["feedback"] and info["admissible_actions"] is None


# ---------------------------------------------------------------- admissible actions
def test_admissible_actions_are_exactly_the_valid_ones(envs):
    rng = random.Random(0)
    env = envs["train"]
    ids = env.task_ids()
    verbs = ["go to {r}", "open {r}", "close {r}", "take {o} from {r}", "put {o} in/on {r}", "heat {o} with {r}",
             "cool {o} with {r}", "clean {o} with {r}", "use {o}", "examine {r}", "examine {o}"]
    checked = 0
    for k in range(24):
        env.reset(options={"task_id": ids[rng.randrange(len(ids))]})
        world = env.world
        for _ in range(25):
            listed = env.admissible_actions()
            snap = world.snapshot()
            for action in listed:  # every listed action succeeds
                world.restore(snap)
                assert env._act(action).error is None, action
                checked += 1
            world.restore(snap)
            for _ in range(6):  # random well-formed commands not listed fail
                text = rng.choice(verbs).format(o=rng.choice(world.o_names), r=rng.choice(world.r_names))
                if text not in listed:
                    out = env._act(text)
                    assert out.error is not None and out.error.kind == "invalid_action", text
                    assert world.snapshot() == snap
            for _ in range(2):  # and so does random text
                text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz 0123456789/") for _ in range(rng.randint(1, 30)))
                alias = resolve(world, text)
                if alias is not None:  # a documented variant spelling ("i") of a listed command
                    assert alias in world.admissible().values()
                elif text.strip() and text not in listed:
                    assert env._act(text).error is not None and world.snapshot() == snap, text
            obs, _, terminated, truncated, info = env.step(rng.choice(listed))
            assert info["error"] is None
            if terminated or truncated:
                break
    assert checked > 2000


def test_variant_spellings_are_accepted(envs):
    env = envs["valid_seen"]
    task = _task_of_type(env, "pick_and_place")
    env.reset(options={"task_id": task.id})
    walk = task.privileged["walkthrough"]
    for action in walk:
        variant = action.upper() + "."
        if action.startswith("put "):
            variant = action.replace(" in/on ", " on ")
        info = env.step(variant)[4]
        assert info["error"] is None, variant
    assert info["success"]


# ---------------------------------------------------------------- splits
def test_unseen_combinations_never_appear_in_train():
    def combos(split: str, n: int) -> set[tuple[str, str]]:
        out = set()
        for i in range(n):
            goal = GoalDraw(split, i).goal
            out.add((goal.obj_type, goal.target.split(" ")[0]))
        return out

    train, seen, unseen = combos("train", 2000), combos("valid_seen", 200), combos("valid_unseen", 200)
    assert unseen and not (unseen & train) and not (unseen & seen)
    assert all(is_unseen_combination(*c) for c in unseen)
    assert not any(is_unseen_combination(*c) for c in train | seen)
    assert len(seen & train) > 0.8 * len(seen)  # seen really is seen
    for task_type in TASK_TYPES:  # every type has both kinds of combinations
        assert split_combinations(task_type, "train") and split_combinations(task_type, "valid_unseen")


def test_splits_differ_in_worlds(envs):
    a = envs["train"].reset(options={"task_id": envs["train"].task_ids()[0]})[0]
    b = envs["valid_seen"].reset(options={"task_id": envs["valid_seen"].task_ids()[0]})[0]
    assert a != b


# ---------------------------------------------------------------- walkthroughs and planner
def test_walkthrough_replay_succeeds_on_hundreds_of_tasks(envs):
    counts = {"train": 180, "valid_seen": 90, "valid_unseen": 90}
    lengths = []
    for split, n in counts.items():
        env = envs[split]
        for task_id in env.task_ids()[:n]:
            _, info = env.reset(options={"task_id": task_id})
            task = info["task"]
            walk = task.privileged["walkthrough"]
            assert task.privileged["solution"] == "\n".join(f"> {a}" for a in walk)
            assert 0 < len(walk) <= env.max_turns
            for turn, action in enumerate(walk, 1):
                obs, reward, terminated, truncated, info = env.step(action)
                assert info["error"] is None, (task_id, action, obs)
                assert terminated == (turn == len(walk)), (task_id, turn)
            assert reward == 1.0 and info["success"] and info["score"] == 1.0
            assert info["feedback"].startswith("Task completed")
            lengths.append(len(walk))
    assert len(lengths) == 360 and max(lengths) < 20


def _small_world(rng: random.Random, task_type: str) -> tuple[World, Goal]:
    """A tiny room (5 receptacles, 3 objects) where an unrestricted BFS is affordable."""
    receptacles = [("cabinet 1", "cabinet", True, "in"), ("countertop 1", "countertop", False, "on"),
                   ("fridge 1", "fridge", True, "in"), ("microwave 1", "microwave", True, "in"),
                   ("sinkbasin 1", "sinkbasin", False, "in")]
    if task_type == "look_at_obj_in_light":
        receptacles[1] = ("desk 1", "desk", False, "on")
    can = CLEAN | HOT | COOL
    target = rng.choice([0, 1, 2, 3, 4])
    away = [i for i in range(5) if i != target]
    n_goal = 2 if task_type == "pick_two_obj_and_place" else rng.choice([1, 2])
    objects = [(f"apple {i}", "apple", can, False, rng.choice(away)) for i in range(1, n_goal + 1)]
    objects.append(("mug 1", "mug", can, False, rng.randrange(5)))
    if task_type == "look_at_obj_in_light":
        objects.append((f"{LAMP} 1", LAMP, 0, True, 1))
        goal = Goal(task_type, "apple", LAMP)
    else:
        goal = Goal(task_type, "apple", receptacles[target][0])
    opened = {i for i in (0, 2, 3) if rng.random() < 0.3}
    return World("kitchen", receptacles, objects, opened), goal


def test_restricted_planner_is_as_short_as_unrestricted_bfs():
    rng = random.Random(7)
    compared = 0
    for task_type, _ in itertools.product(TASK_TYPES, range(10)):
        world, goal = _small_world(rng, task_type)
        checker = GoalChecker(goal, world)
        start = world.snapshot()
        restricted = bfs(world, checker, relevant_expander(checker))
        full = bfs(world, checker, all_commands)
        assert world.snapshot() == start
        assert restricted is not None and full is not None
        assert len(restricted) == len(full), (goal, restricted, full)
        compared += 1
    assert compared == 60


def test_planner_output_is_replayable_text():
    rng = random.Random(11)
    world, goal = _small_world(rng, "pick_cool_then_place")
    checker = GoalChecker(goal, world)
    walk = plan(world, checker)
    for action in walk:
        world.execute(world.admissible()[action])
    assert checker.check() == (True, 1.0)


# ---------------------------------------------------------------- progress and feedback
def test_partial_score_and_feedback_names_the_unmet_condition(envs):
    env = envs["train"]
    task = _task_of_type(env, "pick_clean_then_place", 1)
    walk = task.privileged["walkthrough"]
    clean_at = next(i for i, a in enumerate(walk) if a.startswith("clean "))
    skipped = walk[:clean_at - 1] + walk[clean_at + 1:]  # drop "go to sinkbasin" and "clean ..."
    default_turns, env.max_turns = env.max_turns, len(skipped)
    try:
        env.reset(options={"task_id": task.id})
        for action in skipped:
            obs, reward, terminated, truncated, info = env.step(action)
            assert info["error"] is None, (action, obs)
    finally:
        env.max_turns = default_turns
    assert truncated and not terminated and reward == 0.0
    assert info["score"] == 0.0 and not info["success"]
    obj = skipped[-1].split(" in/on ")[0][len("put "):]
    target = task.metadata["target"]
    assert f"the {obj} was put in {target} but it was not clean" in info["feedback"] or \
           f"the {obj} was put on {target} but it was not clean" in info["feedback"]
    assert "Ran out of turns" in info["feedback"]

    env.reset(options={"task_id": task.id})
    for action in walk[:clean_at + 1]:
        info = env.step(action)[4]
    assert info["score"] == 0.5 and not info["success"]


def test_feedback_counts_invalid_actions():
    env = HouseholdEnv("valid_seen", max_turns=3)
    env.reset(seed=2)
    env.step("dance")
    env.step("look")
    *_, truncated, info = env.step("go to nowhere 1")
    assert truncated
    assert "2 of 3 actions failed (2 invalid commands)" in info["feedback"]
    assert "no receptacle called 'nowhere 1'" in info["feedback"]


# ---------------------------------------------------------------- the observable expert's demonstrations
def test_demonstration_replay_succeeds_within_the_turn_limit(envs):
    for split, n in {"train": 120, "valid_seen": 60, "valid_unseen": 120}.items():
        env = envs[split]
        for task_id in env.task_ids()[:n]:
            _, info = env.reset(options={"task_id": task_id})
            demo = info["task"].privileged["demonstration"]
            assert info["task"].metadata["demonstration_turns"] == len(demo) <= env.max_turns
            assert len(demo) >= len(info["task"].privileged["walkthrough"])
            for turn, action in enumerate(demo, 1):
                obs, reward, terminated, truncated, info = env.step(action)
                assert info["error"] is None, (task_id, action, obs)
                assert terminated == (turn == len(demo)), (task_id, turn)
            assert reward == 1.0 and info["success"]


def test_the_train_demonstrations_are_the_ones_the_cached_base_models_learned_from():
    """Every cached base model (`evaluation.bench.base_models`, keyed by its settings, not by this code) was trained on
    these 2000 demonstrations: a change to the expert must bump BUILD_VERSION, and this pin says so."""
    import hashlib
    import json

    env = HouseholdEnv("train")
    demos = [env.get_task(t).privileged["demonstration"] for t in env.task_ids()]
    assert hashlib.sha1(json.dumps(demos).encode()).hexdigest() == "23bb547bf15da712050e344b85344cc272d8bfe4"


def test_the_expert_resumes_from_any_state_an_agent_leaves():
    """`continuation` labels a student's own states (DAgger): from the start it is the demonstration; after a
    random agent's turns (the wrong object in hand, the target shut, an untreated object put at the target)
    it still solves the task, with only admissible commands, and leaves the world as it found it."""
    from environments.household.expert import continuation

    rng = random.Random(7)
    resumed = 0
    for split in ("train", "valid_unseen"):
        env = HouseholdEnv(split, num_tasks=60)
        for task_id in env.task_ids():
            _, info = env.reset(options={"task_id": task_id})
            world, checker = env.world, env.checker
            assert continuation(world, checker) == info["task"].privileged["demonstration"]
            for _ in range(2):
                env.reset(options={"task_id": task_id})
                for _ in range(rng.randrange(1, 25)):
                    world.apply(rng.choice(list(world.admissible().values())))
                if checker.check()[0]:
                    continue
                before = world.snapshot()
                actions = continuation(world, checker)
                assert world.snapshot() == before
                for action in actions:
                    world.apply(world.admissible()[action])  # KeyError: not admissible
                assert checker.check()[0], (task_id, actions)
                resumed += 1
    assert resumed > 120


def test_demonstration_searches_in_listed_order_and_takes_the_first_object_it_sees(envs):
    """Observable: before its first take the expert visits receptacles in the order the first observation
    lists them, and it never walks past a receptacle where it saw a wanted object (the planner's walkthrough,
    which knows where objects hide, breaks the first rule on most tasks)."""
    env = envs["valid_unseen"]
    walk_breaks = 0
    for task_id in env.task_ids()[:120]:
        obs, info = env.reset(options={"task_id": task_id})
        task, world = info["task"], env.world
        listed = obs.split("you see ", 1)[1]
        position = {name: listed.index(f"a {name},") if f"a {name}," in listed else listed.index(f"a {name}.")
                    for name in world.r_names}
        wanted = task.metadata["object_type"]

        def visits_before_take(actions):
            names = []
            for a in actions:
                if a.startswith("take "):
                    break
                if a.startswith("go to "):
                    names.append(a[6:])
            return names

        demo_visits = visits_before_take(task.privileged["demonstration"])
        assert [position[n] for n in demo_visits] == sorted(position[n] for n in demo_visits), task_id
        looks = []
        for action in task.privileged["demonstration"]:
            if action.startswith("take "):
                break
            obs, *_ = env.step(action)
            if "you see " in obs:
                looks.append(obs.split("you see ", 1)[1])
        assert looks and f"a {wanted} " in looks[-1]
        assert not any(f"a {wanted} " in seen for seen in looks[:-1]), task_id  # it would have taken it there
        walk_visits = visits_before_take(task.privileged["walkthrough"])
        walk_breaks += [position[n] for n in walk_visits] != sorted(position[n] for n in walk_visits) or \
            len(walk_visits) < len(demo_visits)
    assert walk_breaks > 60  # the test can tell the privileged plan from the observable one


def test_show_admissible_lists_the_commands_in_every_observation():
    env = HouseholdEnv("valid_unseen", show_admissible=True)
    obs, info = env.reset(options={"task_id": env.task_ids()[3]})
    assert obs.endswith("Admissible actions: " + ", ".join(info["admissible_actions"]) + ".")
    obs, _, _, _, info = env.step(info["admissible_actions"][0])
    assert obs.endswith("Admissible actions: " + ", ".join(info["admissible_actions"]) + ".")
    plain = HouseholdEnv("valid_unseen").reset(options={"task_id": env.task_ids()[3]})[0]
    assert obs != plain and "Admissible actions" not in plain


def test_the_search_follows_the_neighbour_each_observation_names(envs):
    """The fact that makes the search learnable: arriving somewhere names the next receptacle around the ring,
    and every search step of the demonstration goes exactly there."""
    env = envs["valid_seen"]
    for task_id in env.task_ids()[:60]:
        obs, info = env.reset(options={"task_id": task_id})
        task = info["task"]
        last_named = None
        for action in task.privileged["demonstration"]:
            if action.startswith("take "):
                break
            if action.startswith("go to ") and last_named is not None:
                assert action[6:] == last_named, (task_id, action)
            obs, *_ = env.step(action)
            if "Next to it, you see the " in obs:
                last_named = obs.rsplit("Next to it, you see the ", 1)[1].rstrip(".")
        assert last_named is not None


def test_status_line_restates_the_task_and_what_is_carried_after_every_step():
    env = HouseholdEnv("valid_unseen", status_line=True)
    obs, info = env.reset(options={"task_id": env.task_ids()[3]})
    task = info["task"]
    assert obs.count("Your task is to:") == 1  # the first observation states the task once, as without the line
    status = f"\nYour task is to: {task.instruction} "
    seen_carrying = False
    for action in ["fly away", *task.privileged["demonstration"]]:
        obs, _, _, _, info = env.step(action)
        assert status in obs, obs
        held = env.world.held
        expected = "You are not carrying anything." if held < 0 else f"You are carrying: a {env.world.o_names[held]}."
        assert obs.endswith(expected), obs
        seen_carrying |= held >= 0
    assert seen_carrying and info["success"]
    plain = HouseholdEnv("valid_unseen")
    plain.reset(options={"task_id": env.task_ids()[3]})
    assert "Your task is to" not in plain.step(task.privileged["demonstration"][0])[0]


def test_turn_counter_numbers_the_coming_action_as_a_numbered_plan_names_its_steps():
    """"Step N next." ends the first observation and every status line, invalid turns counted: the number of
    the walkthrough step a plan-following agent takes now, in `actions_block`'s own words."""
    from agentgym_opd.distill import actions_block

    with pytest.raises(ValueError, match="status_line=True"):
        HouseholdEnv("train", turn_counter=True)
    env = HouseholdEnv("valid_unseen", status_line=True, goal_in_view=True, turn_counter=True)
    obs, info = env.reset(options={"task_id": env.task_ids()[1]})
    walkthrough = info["task"].privileged["walkthrough"]
    plan = actions_block(walkthrough)
    assert obs.endswith("\n\nStep 1 next.")
    for k, action in enumerate(walkthrough, 1):
        assert f"Step {k}: {action};" in plan or plan.endswith(f"Step {k}: {action}.")
        obs, _, _, _, info = env.step(action)
        if not info["success"]:
            assert obs.endswith(f" Step {k + 1} next."), obs
    assert info["success"]
    env.reset(options={"task_id": env.task_ids()[1]})
    assert env.step("go to the moon")[0].endswith(" Step 2 next.")  # a failed command still used a turn
    assert "Step" not in HouseholdEnv("valid_unseen", status_line=True).reset(options={"task_id": env.task_ids()[1]})[0]


def test_goal_in_view_names_exactly_what_the_observable_expert_takes_or_uses_next():
    """'Wanted here: X.' appears after an observation exactly when the expert's next action takes or uses X, on
    every task type: it flags what is in view and never says where anything else is."""
    with pytest.raises(ValueError, match="status_line=True"):
        HouseholdEnv("train", goal_in_view=True)
    hints = 0
    for split in ("train", "valid_unseen"):
        env = HouseholdEnv(split, status_line=True, goal_in_view=True, num_tasks=60)
        for task_id in env.task_ids():
            obs, info = env.reset(options={"task_id": task_id})
            demo = info["task"].privileged["demonstration"]
            for k, action in enumerate(demo):
                if k > 0:
                    wanted = obs.rsplit(" Wanted here: ", 1)[1].rstrip(".") if " Wanted here: " in obs else None
                    verb = action.split(" ", 1)[0]
                    if verb in ("take", "use"):
                        assert wanted == action.split(" ")[1] + " " + action.split(" ")[2], (task_id, action, obs)
                        hints += 1
                    else:
                        assert wanted is None, (task_id, action, obs)
                obs, _, _, _, info = env.step(action)
            assert info["success"], task_id
    assert hints >= 120  # every task takes (and some use a lamp): the check covered them all

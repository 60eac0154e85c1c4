"""The observable ALFWorld expert: goal sentences, decisions from observations alone, the search prior, real games.

Real games are played on valid_unseen (one per task type; the prior is counted over train, so these rooms are
new to it). A game takes 2-10 s to load and play on a loaded machine; `scripts/probes/alfworld_expert_probe.py`
measures whole splits.
"""

from __future__ import annotations

import pytest

from agentgym_opd.registry import make
from environments.alfworld import TASK_TYPES
from environments.alfworld.expert import (
    UNIFORM_PRIOR, Goal, GoalParseError, ObservableExpert, expert_from_history, parse_goal, play, prior_from_games,
    train_prior,
)

from conftest import SHARED_DATA as DATA_ROOT

TRAIN_DIR = DATA_ROOT / "alfworld" / "json_2.1.1" / "train"

INTRO = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, you see "
         "a cabinet 2, a cabinet 1, a countertop 1, a fridge 1, a microwave 1, and a sinkbasin 1.\n\n"
         "Your task is to: heat some egg and put it in cabinet.")


@pytest.mark.parametrize("sentence, goal", [
    ("put some spraybottle on toilet.", Goal("pick_and_place_simple", "spraybottle", "toilet")),
    ("put a hot cup in cabinet.", Goal("pick_heat_then_place_in_recep", "cup", "cabinet", "heat")),
    ("cool some mug and put it in coffeemachine.", Goal("pick_cool_then_place_in_recep", "mug", "coffeemachine", "cool")),
    ("put a clean soapbar in countertop.", Goal("pick_clean_then_place_in_recep", "soapbar", "countertop", "clean")),
    ("find two peppershaker and put them in diningtable.", Goal("pick_two_obj_and_place", "peppershaker", "diningtable", count=2)),
    ("put two book in desk.", Goal("pick_two_obj_and_place", "book", "desk", count=2)),
    ("examine the cd with the desklamp.", Goal("look_at_obj_in_light", "cd", lamp="desklamp")),
    ("look at alarmclock under the desklamp.", Goal("look_at_obj_in_light", "alarmclock", lamp="desklamp")),
])
def test_goal_sentences(sentence, goal):
    assert parse_goal(sentence) == goal


def test_every_goal_sentence_of_the_data_parses_to_its_folder_type():
    """All 574 games of the three splits: the parsed type and object are the ones the game folder names."""
    import json
    import re

    games = sorted((DATA_ROOT / "alfworld" / "json_2.1.1").glob("*/*/*/game.tw-pddl"))
    assert len(games) == 574
    for path in games:
        sentence = re.search(r"Your task is to: ([^\"]*)", json.loads(path.read_text())["grammar"]).group(1)
        goal = parse_goal(sentence.replace("\\n", "").strip())
        folder = path.parts[-3].split("-")
        assert (goal.task_type, goal.obj) == (folder[0], folder[1].lower()), path


def test_a_sentence_outside_the_templates_is_a_clear_error():
    with pytest.raises(GoalParseError, match="not an ALFWorld goal sentence"):
        parse_goal("juggle three oranges.")
    with pytest.raises(GoalParseError, match="states no task"):
        ObservableExpert.start("You are in the middle of a room.")


def test_the_expert_searches_opens_treats_and_puts_from_observations_alone():
    """A scripted kitchen: the egg is in the second receptacle the (uniform, listed) order visits; every decision
    follows from the observations: open what is closed, take the egg once seen, heat it, put it in a cabinet."""
    expert = ObservableExpert.start(INTRO)
    assert expert.goal == Goal("pick_heat_then_place_in_recep", "egg", "cabinet", "heat")
    script = [
        ("go to cabinet 2", "You arrive at cabinet 2. The cabinet 2 is closed."),
        ("open cabinet 2", "You open the cabinet 2. The cabinet 2 is open. In it, you see a plate 1."),
        ("go to cabinet 1", "You arrive at cabinet 1. On the cabinet 1, you see nothing."),
        ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a egg 2, and a mug 1."),
        ("take egg 2 from countertop 1", "You pick up the egg 2 from the countertop 1."),
        ("go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed."),
        ("heat egg 2 with microwave 1", "You heat the egg 2 using the microwave 1."),
        ("go to cabinet 2", "You arrive at cabinet 2. The cabinet 2 is open. In it, you see a plate 1."),
        ("move egg 2 to cabinet 2", "You move the egg 2 to the cabinet 2."),
    ]
    for action, observation in script:
        assert expert.next_action() == action
        expert.observe(action, observation)
    assert expert.placed == ["egg 2"]


def test_a_rejected_command_changes_nothing_the_expert_remembers():
    expert = ObservableExpert.start(INTRO)
    expert.observe("take egg 9 from cabinet 7", "Nothing happens.")
    assert expert.next_action() == "go to cabinet 2" and expert.holding is None


def test_a_receptacle_sharing_the_agents_spot_is_examined_after_go_to_is_refused():
    """ALFWorld keeps some receptacles at one spot: at shelf 2, "go to shelf 1" gets "Nothing happens." and the
    shelf is looked at with "examine"; objects seen there are taken without moving."""
    intro = ("You are in the middle of a room. Looking quickly around you, you see a shelf 2, a shelf 1, and a desk 1."
             "\n\nYour task is to: examine the watch with the desklamp.")
    expert = ObservableExpert.start(intro)
    script = [
        ("go to shelf 2", "You arrive at shelf 2. On the shelf 2, you see a pencil 1."),
        ("go to shelf 1", "Nothing happens."),
        ("examine shelf 1", "On the shelf 1, you see a watch 1, and a desklamp 1."),
        ("take watch 1 from shelf 1", "You pick up the watch 1 from the shelf 1."),
        ("use desklamp 1", "You turn on the desklamp 1."),
    ]
    for action, observation in script:
        assert expert.next_action() == action
        expert.observe(action, observation)


def test_the_expert_takes_over_an_agents_state_and_puts_down_what_the_goal_does_not_need():
    """DAgger's label: after an agent took a mug, the expert first puts it down where it stands."""
    turns = [("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a mug 1."),
             ("take mug 1 from countertop 1", "You pick up the mug 1 from the countertop 1.")]
    expert = expert_from_history(INTRO, turns)
    assert expert.next_action() == "move mug 1 to countertop 1"
    expert.observe("move mug 1 to countertop 1", "You move the mug 1 to the countertop 1.")
    assert expert.next_action() == "go to cabinet 2"  # and searches on, skipping the countertop it has seen


def test_the_search_prior_counts_where_objects_lie_and_orders_receptacles_by_chance_per_step():
    prior = train_prior(str(TRAIN_DIR))
    assert prior.openable >= {"cabinet", "drawer", "fridge", "microwave"}
    # a desk lamp stands on furniture, never in a fridge
    assert prior.score("desklamp", "sidetable") > 5 * prior.score("desklamp", "fridge")
    order = prior.order(["fridge 1", "garbagecan 1", "sidetable 1"], "desklamp")
    assert order[0] == "sidetable 1"
    # an object kind the split never had falls back to any object's odds
    assert prior.score("unicorn", "countertop") == prior.score("*", "countertop")
    assert UNIFORM_PRIOR.order(["b 1", "a 1"], "egg") == ["b 1", "a 1"]


def test_prior_from_games_reads_the_pddl_start_state(tmp_path):
    import json

    problem = """(:init (objectType Egg_1 EggType) (objectType Mug_1 MugType) (receptacleType Fridge_1 FridgeType)
                 (receptacleType Cabinet_1 CabinetType) (receptacleType Cabinet_2 CabinetType)
                 (inReceptacle Egg_1 Fridge_1) (inReceptacle Mug_1 Cabinet_2) (openable Cabinet_1) (openable Fridge_1))"""
    game = tmp_path / "g" / "t" / "game.tw-pddl"
    game.parent.mkdir(parents=True)
    game.write_text(json.dumps({"pddl_problem": problem}))
    prior = prior_from_games([game])
    assert prior.hits["egg"] == {"fridge": 1} and prior.seen["egg"] == {"fridge": 1, "cabinet": 2}
    assert prior.openable == {"fridge", "cabinet"}
    assert prior.score("egg", "fridge") > prior.score("egg", "cabinet")


@pytest.fixture(scope="module")
def unseen():
    env = make("alfworld/valid_unseen", data_root=DATA_ROOT, max_turns=30)
    yield env
    env.close()


@pytest.mark.slow
def test_the_expert_wins_a_game_of_each_task_type_it_never_saw(unseen):
    prior = train_prior(str(TRAIN_DIR))
    ids = unseen.task_ids()
    for folder_type in TASK_TYPES.values():
        task_id = next(t for t in ids if t.startswith(folder_type + "-"))
        run = play(unseen, task_id, prior=prior)
        assert run.success and run.stopped == "won", (task_id, run)
        assert len(run.actions) <= 30


@pytest.mark.slow
def test_the_expert_finishes_a_game_an_agent_started_badly(unseen):
    """Replay a wrong start (a wrong object taken, a command the game rejects), then let the expert continue."""
    prior = train_prior(str(TRAIN_DIR))
    task_id = next(t for t in unseen.task_ids() if t.startswith("pick_and_place_simple-"))
    obs, info = unseen.reset(options={"task_id": task_id})
    first = obs
    goal = parse_goal(info["task"].instruction)
    turns = []
    for action in [info["admissible_actions"][0], "take unicorn 1 from nowhere 1"]:
        obs, *_ = unseen.step(action)
        turns.append((action, obs))
    # take the first object in view that the goal does not want, if any
    here = expert_from_history(first, turns, prior=prior)
    stray = next((o for o in here.contents.get(here.location or "", []) if o.split(" ")[0] != goal.obj), None)
    if stray is not None:
        action = f"take {stray} from {here.location}"
        obs, *_ = unseen.step(action)
        turns.append((action, obs))
    expert = expert_from_history(first, turns, prior=prior)
    for _ in range(30 - len(turns)):
        action = expert.next_action()
        assert action is not None
        obs, _, terminated, truncated, step = unseen.step(action)
        assert step["error"] is None, (action, step["error"])
        expert.observe(action, obs)
        if terminated or truncated:
            break
    assert step["success"], task_id

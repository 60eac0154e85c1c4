"""Every env family's default protocol scores the benchmark's own gold answer as a model would write it.

A model does not emit a bare gold string: it fences it, reasons before it, or keeps talking until the token
limit cuts it off. Each family's gold answers are played through the family's *registered* parser in
those shapes, turn by turn on the real env, and must still solve the task.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym_opd.config import load_config, read_mapping

from agentgym_opd.action_parsing import get_parser
from agentgym_opd.registry import env_protocol, env_registry, make

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ------------------------------------------------------------------ how a model wraps an answer
def _command_shapes(gold: str) -> list[tuple[str, str]]:
    return [(gold, "stop"), (f"```\n{gold}\n```", "stop"), (f"Think: I should do this next.\nAction: {gold}", "stop"),
            (f"> {gold}\nThis should bring me closer to the go", "length")]


def _call_shapes(gold: str) -> list[tuple[str, str]]:
    pretty = json.dumps(json.loads(gold), indent=2) if gold.lstrip().startswith("{") else gold  # multi-line
    return [(gold, "stop"), (f"```json\n{pretty}\n```", "stop"), (f"I will call the function.\n{pretty}\nThat returns", "length"),
            (f"<tool_call>\n{gold}\n</tool_call>", "stop")]


def _code_shapes(gold: str) -> list[tuple[str, str]]:
    return [(gold, "stop"), (f"Here is my solution:\n\n{gold}\n\nIt sorts the list first, then", "length"),
            (f"{gold}\n\nA faster variant:\n```python\ndef has_close_elements(numbers, thr", "length")]


def _tag_shapes(gold: str) -> list[tuple[str, str]]:
    return [(gold, "stop"), (f"I need to look this up.\n{gold}", "stop"), (f"{gold}\n<information> made up", "length")]


SHAPES = {"text": _command_shapes, "json": _call_shapes, "code": _code_shapes, "tags": _tag_shapes}


def _play_gold(env_id: str, task_id: str | None = None, parser: str | None = None, **env_kwargs) -> tuple[int, dict]:
    """Play the gold walkthrough through the registered parser, once per shape; return (shapes, last info).

    Each play uses one shape for every turn, so each shape has to solve the task on its own."""
    parser = parser or env_registry.spec(env_id).action_parser
    parse = get_parser(parser)
    shapes = SHAPES.get(parser, lambda gold: [(gold, "stop")])
    env = make(env_id, **env_kwargs)
    try:
        task = task_id or env.task_ids()[0]
        n_shapes = len(shapes("x"))
        step: dict = {}
        for shape in range(n_shapes):
            _, info = env.reset(options={"task_id": task})
            for gold in info["task"].privileged["walkthrough"]:
                text, finish = shapes(gold)[shape]
                action, error = parse(text, finish)
                assert error is None, f"{env_id}: {text!r} ({finish}) -> {error}"
                _, _, terminated, truncated, step = env.step(action)
                assert step["error"] is None, f"{env_id}: {text!r} -> {action!r}: {step['error']}"
                if terminated or truncated:
                    break
            assert step["success"], f"{env_id}: shape {shape} of the gold answer did not solve {task}"
        return n_shapes, step
    finally:
        env.close()


@pytest.mark.parametrize("env_id, parser", [
    ("household/valid_unseen", "text"), ("tooluse/valid_unseen", "json"), ("code/humanevalplus", "code"),
    ("searchqa/hotpotqa_dev", "tags"), ("acebench/normal_single_turn_single_function", "json"),
    ("alfworld/valid_unseen", "text"), ("scienceworld/find-living-thing", "text"),
    ("textworld_express/coin", "text"), ("bfcl/simple_python", "environments.bfcl.protocol:parse_reply"),
])
def test_each_family_registers_its_benchmarks_answer_format(env_id, parser):
    assert env_registry.spec(env_id).action_parser == parser  # spec: BFCL's prompt module loads on use


def test_overrides_replace_the_registered_protocol_and_empty_prompt_means_none():
    base = env_protocol("household/valid_unseen")
    assert base.system_prompt and "one action" in base.system_prompt
    assert env_protocol("household/valid_unseen", action_parser="json", system_prompt="Be brief.") == \
        type(base)("json", "Be brief.")
    assert env_protocol("household/valid_unseen", system_prompt="").system_prompt is None


@pytest.mark.parametrize("env_id", ["household/valid_unseen", "tooluse/valid_unseen", "searchqa/hotpotqa_dev"])
def test_gold_answers_in_model_shapes_solve_the_embedded_and_search_envs(env_id, shared_data):
    kwargs = {"data_root": str(shared_data)} if env_id.startswith("searchqa") else {}
    played, _ = _play_gold(env_id, **kwargs)
    assert played >= 3


def test_gold_code_in_model_shapes_passes_humanevalplus(shared_data):
    played, step = _play_gold("code/humanevalplus", data_root=str(shared_data))
    assert played == 3 and step["score"] == 1.0


def test_gold_calls_in_model_shapes_pass_acebench(shared_data):
    played, _ = _play_gold("acebench/normal_single_turn_single_function", data_root=str(shared_data))
    assert played == 4


@pytest.mark.parametrize("env_id, kwargs", [
    ("alfworld/valid_unseen-pick_and_place", "alfworld"),
    ("scienceworld/find-living-thing", {"split": "dev", "max_tasks": 1}),
    ("textworld_express/coin", {"split": "dev"}),
])
@pytest.mark.slow
def test_gold_commands_in_model_shapes_solve_the_simulated_worlds(env_id, kwargs, shared_data):
    if kwargs == "alfworld":
        kwargs = {"data_root": str(shared_data)}
    played, _ = _play_gold(env_id, **kwargs)
    assert played == 4


def test_gold_calls_through_bfcls_own_decoder():
    pytest.importorskip("environments.bfcl.protocol", reason="environments/bfcl/protocol.py comes with the bfcl work")
    played, step = _play_gold("bfcl/simple_python")
    assert played >= 1 and step["success"]


# ------------------------------------------------------------------ what the token limit may and may not cut
def test_a_reply_cut_at_the_token_limit_fails_only_when_the_cut_took_the_action():
    text, json_, code, tags = (get_parser(n) for n in ("text", "json", "code", "tags"))
    assert text("go to desk 1\nThen I will look for the", "length") == ("go to desk 1", None)
    assert text("I think that the best thing to do is to go to the", "length")[1].kind == "parse_error"
    assert "token limit" in text("I think that the best", "length")[1].message
    assert json_('{"name": "get_price", "arguments": {"item": "ap', "length")[1].kind == "parse_error"
    assert json_('[f(a=1, b="x)")]\nThis calls f', "length") == ('[f(a=1, b="x)")]', None)  # brackets in strings
    assert code("```python\ndef f(x):\n    return", "length")[1].kind == "parse_error"
    assert code("```python\ndef f(x):\n    return x\n", "stop")[0].endswith("return x\n")  # ended its turn: keep it
    assert tags("<answer> Par", "length")[1].kind == "parse_error"
    assert tags("Let me think about", "length") == ("Let me think about", None)  # no tag: the env explains


def test_parsers_are_named_or_loaded_by_entry_point_and_bad_names_say_what_exists():
    assert get_parser("agentgym_opd.action_parsing:parse_code_action") is get_parser("code")
    with pytest.raises(ValueError, match="code.*json.*tags.*text"):
        get_parser("xml")
    with pytest.raises(ValueError, match="cannot be loaded"):
        get_parser("no_such_module:parse")


# ------------------------------------------------------------------ the shipped recipes
RECIPES = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
RECIPE_ENV_ARGS = {"alfworld": "data", "code": "data", "searchqa": "data", "scienceworld": {"max_tasks": 1}}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
@pytest.mark.slow
def test_each_recipe_names_its_parser_and_prompt_and_its_envs_gold_scores_through_them(recipe, shared_data):
    rollout = read_mapping(recipe)["rollout"]
    assert "action_parser" in rollout and "system_prompt" in rollout, f"{recipe.name} must name its parser and prompt"
    config = load_config(recipe)
    if config.rollout.action_parser.startswith("environments.bfcl.protocol"):
        pytest.importorskip("environments.bfcl.protocol", reason="environments/bfcl/protocol.py comes with the bfcl work")
    for env_id in {config.env, config.eval.env or config.env}:
        kwargs = RECIPE_ENV_ARGS.get(env_id.split("/")[0], {})
        kwargs = {"data_root": str(shared_data)} if kwargs == "data" else kwargs
        played, step = _play_gold(env_id, parser=config.rollout.action_parser, **kwargs)
        assert played >= 1 and step["success"]


def test_a_run_config_records_the_resolved_protocol_and_the_env_section(tmp_path):
    from agentgym_opd.config import save_config
    from agentgym_opd.trainer import resolve_protocol

    household = resolve_protocol(load_config(None, ["env=household/train"]), env_args={"num_tasks": 2})
    assert household.rollout.action_parser == "text" and "one action" in household.rollout.system_prompt
    assert household.env_args == {"num_tasks": 2}
    code = resolve_protocol(load_config(None, ["env=code/humaneval"]))
    assert (code.rollout.action_parser, code.rollout.system_prompt) == ("code", "")  # '' = no system prompt
    chosen = resolve_protocol(load_config(None, ["env=code/humaneval", "rollout.action_parser=json",
                                                 "rollout.system_prompt=Write code."]))
    assert (chosen.rollout.action_parser, chosen.rollout.system_prompt) == ("json", "Write code.")
    (tmp_path / "run.yaml").write_text("env:\n  id: household/train\n  args: {num_tasks: 3}\n")
    sectioned = load_config(tmp_path / "run.yaml")
    assert (sectioned.env, sectioned.env_args) == ("household/train", {"num_tasks": 3})
    assert load_config(save_config(household, tmp_path / "saved.yaml")) == household

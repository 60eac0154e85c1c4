"""Several teachers: `--teacher NAME=PATH` repeated, routing per task, the split loss, token shares, records,
and the mixture env that lets one run route by env."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import agentgym_opd
from agentgym_opd.config import ConfigError, run_config_from_cli
from agentgym_opd.mixture import MixtureEnv
from agentgym_opd.policy.hf import HFPolicy
from agentgym_opd.policy.tiny import default_tiny_model
from agentgym_opd.teachers import (RoutingRule, TeacherSet, parse_teacher_flags, route_key, run_teacher_name,
                                   token_shares)
from agentgym_opd.types import Task
from algorithms.opd import OPD, OPDConfig
from tiny_rollouts import perturbed_tiny_teacher, tiny_household_rollout

MIX = "household/train-pick_and_place+household/train-pick_heat_then_place"


def task(env_id="household/train", split="train", **metadata) -> Task:
    return Task(id="t1", env_id=env_id, split=split, instruction="", metadata=metadata)


# ----------------------------------------------------------------------------------------------------
# The command line, the config, the rule
# ----------------------------------------------------------------------------------------------------


def test_teacher_flags_one_path_or_several_names():
    assert parse_teacher_flags(None) == (None, {})
    assert parse_teacher_flags(["runs/teacher"]) == ("runs/teacher", {})
    assert parse_teacher_flags(["a=runs/x", "b=household-teacher"]) == (None, {"a": "runs/x", "b": "household-teacher"})
    assert parse_teacher_flags(["/data/w=3/model"]) == ("/data/w=3/model", {})  # a path with '=' stays a path
    with pytest.raises(ValueError, match="not both"):
        parse_teacher_flags(["runs/x", "a=runs/y"])
    with pytest.raises(ValueError, match="given twice"):
        parse_teacher_flags(["a=runs/x", "a=runs/y"])
    with pytest.raises(ValueError, match="name each"):
        parse_teacher_flags(["runs/x", "runs/y"])


def test_config_checks_the_teacher_keys_against_each_other():
    ok = run_config_from_cli(None, ['model.teachers={"a": "x", "b": "y"}', "model.teacher_route=metadata.task_type",
                                    'model.teacher_routes={"pick_*": a, "*": b}'])
    assert ok.model.teachers == {"a": "x", "b": "y"} and list(ok.model.teacher_routes) == ["pick_*", "*"]
    with pytest.raises(ConfigError, match="not both"):
        run_config_from_cli(None, ['model.teachers={"a": "x"}'], teacher="z")
    with pytest.raises(ConfigError, match=r"names \['c'\]"):
        run_config_from_cli(None, ['model.teachers={"a": "x"}', 'model.teacher_routes={"*": c}'])
    with pytest.raises(ConfigError, match="metadata.<field>"):
        run_config_from_cli(None, ['model.teachers={"a": "x"}', "model.teacher_route=colour"])


def test_routing_by_env_family_split_and_metadata_first_match_wins():
    by_env = RoutingRule("env", (("household/*", "home"), ("*", "tools")), ("home", "tools"))
    assert by_env.teacher_for(task("household/train-pick_and_place")) == "home"
    assert by_env.teacher_for(task("tooluse/train")) == "tools"
    by_name = RoutingRule("family", (), ("household", "tooluse"))  # no routes: the teacher named like the key
    assert by_name.teacher_for(task("tooluse/train")) == "tooluse"
    with pytest.raises(ValueError, match="no teacher for family='bfcl'"):
        by_name.teacher_for(task("bfcl/simple"))
    assert route_key(task(task_type="pick_heat_then_place"), "metadata.task_type") == "pick_heat_then_place"
    assert route_key(task(split="valid_seen"), "split") == "valid_seen"
    with pytest.raises(ValueError, match="no metadata field 'colour'"):
        route_key(task(), "metadata.colour")


def test_records_name_every_teacher_and_the_schema_accepts_it():
    from evaluation.records import FIELDS

    name = run_teacher_name({"teachers": {"home": "tiny", "tools": "runs/tools"}})
    assert name == "home=tiny,tools=runs/tools"
    assert FIELDS["teacher"][1](name) is None
    assert run_teacher_name({"teacher": "runs/one"}) == "runs/one"


# ----------------------------------------------------------------------------------------------------
# The routed loss
# ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rollout():
    return tiny_household_rollout(seed=5, max_turns=3, max_new_tokens=8)


def routes_of(batch) -> tuple[RoutingRule, list[str]]:
    """Route by the tasks' own ids: the first task's rows to `a`, the other's to `b` (both groups non-empty)."""
    first = batch.episodes[0].task.metadata["task_type"]
    rule = RoutingRule("metadata.task_type", ((first, "a"), ("*", "b")), ("a", "b"))
    return rule, [rule.teacher_for(e.task) for e in batch.episodes]


@pytest.mark.slow
def test_the_routed_loss_is_each_groups_loss_under_its_own_teacher(rollout):
    student, batch = rollout
    rule, names = routes_of(batch)
    assert set(names) == {"a", "b"}
    t_a, t_b = perturbed_tiny_teacher(0.05, seed=1), perturbed_tiny_teacher(0.05, seed=2)
    routed = OPD(OPDConfig(), copy.deepcopy(student), TeacherSet({"a": t_a, "b": t_b}, rule), micro_batch_size=3)
    state = routed.prepare(batch)
    step = routed.steps(state)[0]
    coef = routed.coefficients(batch, state, step)
    loss, metrics = routed.compute_loss(batch, slice(0, len(batch)), coef, state, step)
    expected = 0.0
    for name, teacher in (("a", t_a), ("b", t_b)):
        single = OPD(OPDConfig(), routed.student, teacher)
        keep = torch.tensor([n == name for n in names], dtype=torch.float32)[:, None]
        expected += float(single.compute_loss(batch, slice(0, len(batch)), {"distill": coef["distill"] * keep},
                                              state, step)[0].detach())
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    # and it is neither teacher alone
    alone = float(OPD(OPDConfig(), routed.student, t_a).compute_loss(batch, slice(0, len(batch)), coef, state,
                                                                     step)[0].detach())
    assert abs(alone - float(loss.detach())) > 1e-4


@pytest.mark.slow
def test_one_teacher_under_two_names_gives_the_single_teacher_step(rollout):
    student, batch = rollout
    rule, _ = routes_of(batch)
    teacher = perturbed_tiny_teacher(0.05, seed=1)
    single = OPD(OPDConfig(), copy.deepcopy(student), teacher, micro_batch_size=3)
    routed = OPD(OPDConfig(), copy.deepcopy(student), TeacherSet({"a": teacher, "b": teacher}, rule),
                 micro_batch_size=3)
    m_single, m_routed = single.update(batch), routed.update(batch)
    assert m_routed["loss"] == pytest.approx(m_single["loss"], rel=1e-5)
    for p, q in zip(single.model.parameters(), routed.model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-7)
    shares = {k: v for k, v in m_routed.items() if k.startswith("teacher_share/")}
    assert set(shares) == {"teacher_share/a", "teacher_share/b"} and sum(shares.values()) == pytest.approx(1.0)


def test_token_shares_count_agent_tokens(rollout):
    _, batch = rollout
    names = ["a"] + ["b"] * (len(batch) - 1)
    shares = token_shares(batch, names, ["a", "b", "c"])
    tokens = batch.loss_mask.sum(dim=1).float()
    assert shares["teacher_share/a"] == pytest.approx(float(tokens[0] / tokens.sum()))
    assert shares["teacher_share/c"] == 0.0


def test_a_method_without_routing_refuses_several_teachers(tmp_path):
    from agentgym_opd.trainer import Trainer

    config = run_config_from_cli(None, ['model.teachers={"a": "tiny", "b": "tiny"}', f"output_dir={tmp_path}"],
                                 algorithm="sage_opd", env="household/train", student="tiny")
    with pytest.raises(ValueError, match="does not route tasks to several teachers"):
        Trainer(config, progress=False)


# ----------------------------------------------------------------------------------------------------
# The mixture env, and a run routed by env end to end
# ----------------------------------------------------------------------------------------------------


def test_a_mixture_env_plays_each_task_in_its_own_env():
    env = agentgym_opd.make(MIX, max_turns=4)
    assert isinstance(env, MixtureEnv)
    ids = env.task_ids()
    assert ids[0].startswith("household/train-pick_and_place::") and ids[-1].startswith(
        "household/train-pick_heat_then_place::")
    obs, info = env.reset(options={"task_id": ids[-1]})
    assert info["task"].env_id == "household/train-pick_heat_then_place" and env.max_turns == 4
    assert env.step("look")[4]["turn"] == 1
    with pytest.raises(KeyError, match="unknown task id"):
        env.reset(options={"task_id": "household/train::x"})
    with pytest.raises(ValueError, match="read replies differently"):
        agentgym_opd.registry.env_protocol("household/train+tooluse/train")
    assert agentgym_opd.registry.env_protocol("household/train+tooluse/train", action_parser="text",
                                              system_prompt="").action_parser == "text"


@pytest.mark.slow
def test_train_with_two_teachers_routed_by_env_logs_each_teachers_token_share(tmp_path, capsys):
    from agentgym_opd.cli import main
    from agentgym_opd.policy.loading import resolve_policy

    teacher = tmp_path / "teacher"
    perturbed_tiny_teacher(0.05).model.save_pretrained(teacher)
    HFPolicy.from_pretrained(default_tiny_model()).tokenizer.save_pretrained(teacher)
    out = tmp_path / "run"
    code = main(["train", "--algo", "opd", "--env", MIX, "--student", "tiny", "--teacher", f"place={teacher}",
                 "--teacher", "heat=tiny", "--output-dir", str(out), "--no-progress",
                 'model.teacher_routes={"*pick_and_place": place, "*pick_heat_then_place": heat}',
                 "train.steps=2", "rollout.tasks_per_step=4", "rollout.max_turns=2", "rollout.max_new_tokens=6"])
    assert code == 0, capsys.readouterr().err
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        assert line["teacher_share/place"] + line["teacher_share/heat"] == pytest.approx(1.0)
    assert any(0 < line["teacher_share/place"] < 1 for line in lines)  # both teachers taught in one batch
    source = resolve_policy(str(out))
    assert source.teacher == f"place={teacher},heat=tiny"


def save_other_tokenizer_teacher(folder) -> None:
    """A small random Llama reading SmolLM2's tokenizer (a teacher of another tokenizer at a tiny model's cost)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from test_cross_tokenizer import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.mark.slow
def test_two_teachers_one_of_another_tokenizer_under_torchrun_match_one_process(tmp_path):
    """`torchrun --nproc_per_node 2 ... train --teacher place=A --teacher heat=B train.strategy=ddp`, with A the
    student's own tokenizer and B another (both paths in one DDP step, a rank's rows possibly all on one path),
    logs the one-process run's losses and token shares and ends on its weights. The shipped household pair's
    student ends its replies at different lengths, so the ranks hold different token counts."""
    import os
    import socket
    import subprocess
    import sys

    other = tmp_path / "other"
    save_other_tokenizer_teacher(other)

    def command(out, *prefix, strategy):
        return [*prefix, "-m", "agentgym_opd.cli", "train", "--algo", "opd", "--env", MIX,
                "--student", "household-student", "--teacher", "place=household-teacher", "--teacher", f"heat={other}",
                "--output-dir", str(out), "--no-progress",
                'model.teacher_routes={"*pick_and_place": place, "*pick_heat_then_place": heat}',
                "model.device=cpu", "train.steps=2", "train.lr=1e-3", "train.optimizer=sgd",
                "train.micro_batch_size=1", "rollout.tasks_per_step=4", "rollout.max_turns=2",
                "rollout.max_new_tokens=16", f"train.strategy={strategy}"]

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one, two = tmp_path / "one", tmp_path / "two"
    done = subprocess.run(command(one, sys.executable, strategy="none"), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "teacher heat: teacher tokenizer differs" in done.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", str(port)]
    done = subprocess.run(command(two, *torchrun, strategy="ddp"), cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {name: [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            for name, out in (("one", one), ("two", two))}
    assert [r["step"] for r in rows["two"]] == [1, 2]
    for a, b in zip(rows["one"], rows["two"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), a["step"]
        assert b["cross/full_share"] == pytest.approx(a["cross/full_share"], rel=1e-5, abs=1e-7), a["step"]
        for name in ("place", "heat"):  # shares of the global batch's tokens, not a mean of the ranks' shares
            assert b[f"teacher_share/{name}"] == pytest.approx(a[f"teacher_share/{name}"], rel=1e-6), a["step"]
    assert any(0 < r["teacher_share/heat"] < 1 for r in rows["one"])
    final = {name: torch.load(out / "checkpoints" / "step_2" / "trainer_state.pt", weights_only=False)["trainable"]
             for name, out in (("one", one), ("two", two))}
    for name in final["one"]:
        torch.testing.assert_close(final["two"][name], final["one"][name], rtol=1e-5, atol=1e-6)

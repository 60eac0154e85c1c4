"""The typed run config: file + overrides, validation errors that name the key, YAML round trip."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Literal

import pytest

from agentgym_opd.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    constrained,
    dataclass_from_dict,
    describe,
    load_config,
    parse_override,
    save_config,
    to_dict,
)


@dataclass
class ToyAlgoConfig:
    """Stands in for an algorithm's own config class (any dataclass works)."""

    beta: float = constrained(0.1, ge=0, help="KL weight")
    divergence: Literal["reverse_kl", "forward_kl", "jsd"] = "reverse_kl"
    top_m: int | None = constrained(None, ge=1)
    teacher: str = constrained("ema", choices=("fixed", "ema", "live"))
    ema_rate: float = constrained(0.05, gt=0, le=1)
    seeds: tuple[int, ...] = (0, 1, 2)
    mix: list[float] = field(default_factory=lambda: [0.5, 0.5])
    use_tail: bool = True

    def __post_init__(self) -> None:
        if abs(sum(self.mix) - 1.0) > 1e-9:
            raise ValueError(f"mix weights must sum to 1, got {self.mix}")


def test_yaml_file_plus_overrides_parsed_by_field_type(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "algorithm: grpo\nenv: household/train\n"
        "train:\n  lr: 1e-4\n  steps: 50\n"  # PyYAML reads 1e-4 as a string: accepted for a float field
        "rollout:\n  group_size: 4\nalgo:\n  beta: 0.2\n"
    )
    overrides = ["train.lr=3e-5", "rollout.group_size=8", "train.grad_clip=none", "model.student=/m/tiny", "algo.divergence=jsd"]
    config = load_config(path, overrides)
    assert isinstance(config, RunConfig)
    assert config.train.lr == 3e-5 and isinstance(config.train.lr, float)
    assert config.train.steps == 50
    assert config.rollout.group_size == 8 and isinstance(config.rollout.group_size, int)
    assert config.train.grad_clip is None
    assert config.model.student == "/m/tiny"
    assert config.algo == {"beta": 0.2, "divergence": "jsd"}
    assert config.rollout.temperature == 1.0  # untouched defaults stay


def test_json_file_loads_the_same(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"algorithm": "opd", "train": {"lr": 0.001}, "eval": {"every": 10}}))
    config = load_config(path)
    assert config.algorithm == "opd" and config.train.lr == 0.001 and config.eval.every == 10


def test_saved_yaml_reloads_equal_including_validated_algo_section(tmp_path):
    config = load_config(
        None,
        ["algorithm=sdpo", "train.lr=1e-7", "rollout.top_p=0.95", "algo.seeds=[3,4]", "algo.top_m=20", "algo.mix=[0.25,0.75]"],
        algo_config_cls=ToyAlgoConfig,
    )
    assert config.algo["beta"] == 0.1  # defaults filled in, so the saved file records every knob
    saved = save_config(config, tmp_path / "ckpt" / "config.yaml")
    reloaded = load_config(saved, algo_config_cls=ToyAlgoConfig)
    assert reloaded == config
    assert reloaded.algo_config(ToyAlgoConfig) == ToyAlgoConfig(seeds=(3, 4), top_m=20, mix=[0.25, 0.75])
    assert to_dict(reloaded) == to_dict(config)


def test_unknown_key_lists_close_matches():
    with pytest.raises(ConfigError, match=r"unknown config key 'train\.lrr'; did you mean 'train\.lr'"):
        apply_overrides(RunConfig(), ["train.lrr=1e-4"])
    with pytest.raises(ConfigError, match=r"'rollout\.group_sise'.*did you mean 'rollout\.group_size'"):
        dataclass_from_dict(RunConfig, {"rollout": {"group_sise": 4}})
    with pytest.raises(ConfigError, match=r"unknown config key 'trian'; did you mean 'train'"):
        dataclass_from_dict(RunConfig, {"trian": {}})
    with pytest.raises(ConfigError, match=r"'algo\.bta'.*did you mean 'algo\.beta'"):
        RunConfig(algo={"bta": 0.3}).algo_config(ToyAlgoConfig)


def test_wrong_types_name_the_key_and_an_example():
    with pytest.raises(ConfigError, match=r"'rollout\.group_size' expects an int, got 'eight'.*rollout\.group_size=8"):
        apply_overrides(RunConfig(), ["rollout.group_size=eight"])
    with pytest.raises(ConfigError, match=r"'train\.lr' expects a float"):
        dataclass_from_dict(RunConfig, {"train": {"lr": [1, 2]}})
    with pytest.raises(ConfigError, match=r"'env' expects a string"):
        dataclass_from_dict(RunConfig, {"env": 3})
    with pytest.raises(ConfigError, match=r"'algo\.use_tail' expects a bool"):
        dataclass_from_dict(ToyAlgoConfig, {"use_tail": "maybe"}, path="algo")
    with pytest.raises(ConfigError, match=r"'algo\.divergence' = 'tv' is not one of"):
        dataclass_from_dict(ToyAlgoConfig, {"divergence": "tv"}, path="algo")
    with pytest.raises(ConfigError, match=r"'train' is a section"):
        apply_overrides(RunConfig(), ["train=3"])
    with pytest.raises(ConfigError, match=r"'train\.lr' is a value, not a section"):
        apply_overrides(RunConfig(), ["train.lr.x=3"])
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        parse_override("train.lr")


def test_out_of_range_and_choices_say_what_is_allowed():
    with pytest.raises(ConfigError, match=r"'train\.lr' = -0\.1 is out of range: it must be > 0"):
        apply_overrides(RunConfig(), ["train.lr=-0.1"])
    with pytest.raises(ConfigError, match=r"'rollout\.top_p' = 1\.5 is out of range: it must be > 0 and <= 1"):
        apply_overrides(RunConfig(), ["rollout.top_p=1.5"])
    with pytest.raises(ConfigError, match=r"'model\.dtype' = 'bfloat61' is not one of: .*did you mean 'bfloat16'"):
        apply_overrides(RunConfig(), ["model.dtype=bfloat61"])
    with pytest.raises(ConfigError, match=r"'algo\.top_m' = 0 is out of range"):
        dataclass_from_dict(ToyAlgoConfig, {"top_m": 0}, path="algo")


def test_post_init_errors_and_missing_required_keys_are_config_errors():
    with pytest.raises(ConfigError, match=r"invalid config section 'algo': mix weights must sum to 1"):
        dataclass_from_dict(ToyAlgoConfig, {"mix": [0.5, 0.6]}, path="algo")

    @dataclass
    class NeedsPath:
        path: str
        retries: int = 2

    with pytest.raises(ConfigError, match=r"missing required config key 'path'.*path=VALUE"):
        dataclass_from_dict(NeedsPath, {"retries": 3})
    assert dataclass_from_dict(NeedsPath, {"path": "/x"}) == NeedsPath("/x")


def test_bad_files_raise_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse config file"):
        load_config(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(listed)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty) == RunConfig()


def test_overrides_do_not_mutate_the_input_and_describe_lists_keys():
    base = RunConfig()
    changed = apply_overrides(base, {"train.steps": 7, "algo.beta": 0.5})
    assert base.train.steps == 100 and base.algo == {}
    assert changed.train.steps == 7 and changed.algo == {"beta": 0.5}
    lines = describe(RunConfig)
    assert any(line.startswith("train.lr: float = 1e-05  # learning rate") for line in lines)
    assert any(line.startswith("rollout.group_size: int = 1") for line in lines)


def test_run_config_from_cli_flags_then_overrides(tmp_path):
    from agentgym_opd.config import run_config_from_cli

    path = tmp_path / "base.yaml"
    path.write_text("train:\n  steps: 3\n")
    config = run_config_from_cli(
        path, ["model.teacher=/t/big", "algo.ema_rate=0.1"], algorithm="sdpo", env="household/train",
        student="/s/tiny", teacher="/t/small", algo_config_cls=ToyAlgoConfig,
    )
    assert (config.algorithm, config.env, config.model.student) == ("sdpo", "household/train", "/s/tiny")
    assert config.model.teacher == "/t/big"  # an explicit override wins over the shorthand flag
    assert config.train.steps == 3 and config.algo_config(ToyAlgoConfig).ema_rate == 0.1


def test_every_gpu_recipe_in_configs_validates_against_its_algorithm_and_names_registered_envs():
    """The GPU recipes (docs/gpu.md) are files a user runs; they must not rot as configs and algorithms change."""
    from pathlib import Path

    import yaml

    from agentgym_opd.registry import env_registry
    from agentgym_opd.trainer import algorithm_class

    recipes = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
    assert len(recipes) >= 5
    for path in recipes:
        raw = yaml.safe_load(path.read_text())
        config = load_config(path, algo_config_cls=algorithm_class(raw["algorithm"]).Config)
        assert config.env in env_registry, path
        assert config.eval.env is None or config.eval.env in env_registry, path
        if algorithm_class(config.algorithm).needs_teacher:
            assert config.model.teacher, f"{path.name}: {config.algorithm} needs model.teacher"


@pytest.mark.slow
def test_every_recipe_runs_two_steps_of_the_tiny_model_under_torchrun_with_two_gloo_processes(tmp_path):
    """Each ``configs/*.yaml`` as written (algorithm, env, strategy, micro-batch, LoRA rank, algo knobs), with
    only the scale swapped: the tiny model (and a tiny teacher where the recipe has one) on CPU with the HF
    backend, 2 steps of 2 short episodes, under ``torchrun --nproc_per_node 2`` (gloo)."""
    import json
    import socket
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from agentgym_opd.policy.tiny import default_tiny_model

    from conftest import SHARED_DATA as data  # ../shared/data, or AGENTGYM_OPD_TEST_DATA

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root),
           **({"AGENTGYM_OPD_DATA": str(data)} if data.is_dir() else {})}
    recipes = sorted((root / "configs").glob("*.yaml"))
    assert len(recipes) >= 5
    for path in recipes:
        raw = yaml.safe_load(path.read_text())
        out = tmp_path / path.stem
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(port), "-m", "agentgym_opd.cli", "train", "--config", str(path), "--student", "tiny",
               "--output-dir", str(out), "--no-progress", "model.backend=hf", "model.device=cpu", "model.dtype=float32",
               "train.steps=2", "train.checkpoint_every=0", "rollout.tasks_per_step=2", "rollout.max_turns=2",
               "rollout.max_new_tokens=8", "eval.every=0"]
        if raw["model"].get("teacher"):
            cmd += ["--teacher", str(default_tiny_model())]
        if raw["algorithm"] == "lopd":
            cmd += ["algo.embedder=hashing"]
        done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{path.name}:\n{done.stderr[-3000:]}"
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2], path.name
        assert all(r["world_size"] == 2 and r["strategy"] == raw["train"]["strategy"] for r in rows), path.name
        saved = yaml.safe_load((out / "config.yaml").read_text())
        assert saved["model"]["lora_rank"] == raw["model"].get("lora_rank", 0), path.name  # LoRA where the recipe has it

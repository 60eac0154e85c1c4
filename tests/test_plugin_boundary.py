"""The core never imports a plugin package by name (DESIGN.md): read every import of ``agentgym_opd/`` with ast.

Built-in environments, algorithms and the evaluation commands are found through entry points exactly as a
third party's would be; an import of ``environments``, ``algorithms`` or ``evaluation`` from the core
(module level or inside a function) would make the core depend on them."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ("environments", "algorithms", "evaluation")


def imported_modules(source: str) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in the source, wherever it sits."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def plugin_imports(path: Path) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} imports {module}"
            for line, module in imported_modules(path.read_text(encoding="utf-8"))
            if module.split(".")[0] in PLUGINS]


def test_the_reader_sees_every_import_form():
    source = ("import algorithms.grpo\nfrom evaluation import bench\n"
              "def f():\n    from environments.household import X\n    import importlib\n"
              "    importlib.import_module('algorithms.lopd')\nfrom . import sibling\nimport torch\n")
    assert [m for _, m in sorted(imported_modules(source))] == ["algorithms.grpo", "evaluation", "environments.household",
                                                        "importlib", "algorithms.lopd", "torch"]


def test_nothing_in_the_core_imports_a_plugin_package():
    files = sorted((ROOT / "agentgym_opd").rglob("*.py"))
    assert len(files) > 20
    offenders = [hit for path in files for hit in plugin_imports(path)]
    assert not offenders, "the core imports plugin packages by name:\n" + "\n".join(offenders)


def test_the_bench_command_is_an_evaluation_entry_point_like_eval():
    import tomllib

    commands = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["agentgym_opd.commands"]
    assert commands["bench"] == "agentgym_opd.evaluation.bench.command"
    assert commands["eval"] == "agentgym_opd.evaluation.eval_command"
    import evaluation.bench.command as bench

    assert bench.HELP and callable(bench.add_arguments) and callable(bench.run)
    assert not (ROOT / "agentgym_opd" / "commands" / "bench.py").exists()


# ----------------------------------------------------------------------------------------------------
# Namespaced import names (agentgym_opd.aliases): agentgym_opd.<package> is the top-level package itself
# ----------------------------------------------------------------------------------------------------

ALIASED = ("algorithms", "environments", "evaluation", "experience_bank")


def run_python(script: str, **env: str) -> dict:
    """Run ``script`` in a fresh interpreter (outside the repository) and return the JSON of its last line."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                         cwd="/", env={**os.environ, **env}, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_namespaced_name_is_the_same_module_object_as_the_top_level_one():
    import importlib

    import agentgym_opd

    for package in ALIASED:
        assert importlib.import_module(f"agentgym_opd.{package}") is importlib.import_module(package), package
    import agentgym_opd.algorithms.opd
    import agentgym_opd.evaluation.bench.settings
    import algorithms.opd
    import evaluation.bench.settings

    assert agentgym_opd.algorithms.opd.OPD is algorithms.opd.OPD
    assert agentgym_opd.evaluation.bench.settings.BenchSettings is evaluation.bench.settings.BenchSettings
    # the module keeps its own name and spec (pickling, reload and multiprocessing read them)
    assert algorithms.opd.__name__ == algorithms.opd.__spec__.name == "algorithms.opd"


def test_the_namespaced_name_imported_first_loads_no_second_copy():
    """In a fresh process the namespaced name comes first: the real module is imported once, under its own name,
    and both names give that one object."""
    result = run_python("""
        import json, sys
        from agentgym_opd.algorithms.opd import OPD
        from agentgym_opd.environments.household.env import HouseholdEnv
        import algorithms.opd, environments.household.env
        same = [OPD is algorithms.opd.OPD, HouseholdEnv is environments.household.env.HouseholdEnv]
        copies = {id(m) for m in sys.modules.values() if (getattr(m, "__file__", None) or "").endswith("algorithms/opd.py")}
        print(json.dumps({"same": same, "copies": len(copies), "name": OPD.__module__,
                          "spec": algorithms.opd.__spec__.name}))
    """)
    assert result == {"same": [True, True], "copies": 1, "name": "algorithms.opd", "spec": "algorithms.opd"}


def test_importing_the_core_imports_no_plugin_package_and_unknown_names_fail_as_usual():
    """The finder maps a name only when it is imported: `import agentgym_opd` (which loads the env entry points)
    brings in no algorithm, evaluation or experience-bank module; a name that does not exist fails as any
    missing module does; other agentgym_opd names are not the finder's."""
    result = run_python("""
        import json, sys
        import agentgym_opd
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("algorithms", "evaluation", "experience_bank"))
        errors = []
        for name in ("agentgym_opd.algorithms.no_such_method", "agentgym_opd.no_such_package"):
            try:
                __import__(name)
            except ModuleNotFoundError as err:
                errors.append(str(err))
        print(json.dumps({"loaded": loaded, "errors": errors}))
    """)
    assert result["loaded"] == []
    assert result["errors"] == ["No module named 'agentgym_opd.algorithms.no_such_method'",
                                "No module named 'agentgym_opd.no_such_package'"]


def test_entry_points_use_the_namespaced_names():
    import tomllib

    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    values = [v for group in points.values() for v in group.values()]
    assert len(values) > 20
    assert all(v.startswith("agentgym_opd.") for v in values), [v for v in values if not v.startswith("agentgym_opd.")]
    # installed (pip install -e .), each loads the very object its top-level name holds
    import importlib
    from importlib import metadata

    from agentgym_opd.aliases import real_name

    installed = [ep for group in points for ep in metadata.entry_points(group=group) if ep.dist.name == "agentgym-opd"]
    assert sorted(ep.value for ep in installed) == sorted(values), "reinstall: pip install --no-deps -e ."
    for ep in installed:
        module, _, attr = ep.value.partition(":")
        real = importlib.import_module(real_name(module) or module)
        assert ep.load() is (getattr(real, attr) if attr else real), ep.value


NAMESPACED_PLUGIN = '''
from agentgym_opd import register
from agentgym_opd.algorithms.opd import OPD
from agentgym_opd.environments.household.env import HouseholdEnv


class ShortHousehold(HouseholdEnv):
    """The household env, at most 3 turns."""

    def __init__(self, **kwargs):
        super().__init__(**{**kwargs, "max_turns": 3})


class MyOPD(OPD):
    """OPD, subclassed through the namespaced name."""


def register_envs():
    register("nsplugin/train", entry_point="ns_plugin:ShortHousehold", split="train", num_tasks=2)
'''


@pytest.mark.slow
def test_a_plugin_written_against_the_namespaced_names_registers_and_trains(tmp_path):
    """A third party's package that imports only agentgym_opd.* names: its env and its OPD subclass are found
    through its entry points, the class is a subclass of the very OPD the registry holds, and one training
    step runs through the CLI."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "ns_plugin.py").write_text(NAMESPACED_PLUGIN)
    dist = site / "ns_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ns-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[agentgym_opd.environments]\nns = ns_plugin:register_envs\n\n"
                                           "[agentgym_opd.algorithms]\nmy_opd = ns_plugin:MyOPD\n")
    result = run_python("""
        import json
        import agentgym_opd, algorithms.opd
        from agentgym_opd.trainer import algorithm_class
        env = agentgym_opd.make("nsplugin/train")
        env.reset(seed=0)
        print(json.dumps({"subclass": issubclass(algorithm_class("my_opd"), algorithms.opd.OPD),
                          "tasks": len(env.task_ids()), "max_turns": env.max_turns,
                          "errors": {**agentgym_opd.env_registry.plugin_errors,
                                     **agentgym_opd.algorithm_registry.plugin_errors}}))
    """, PYTHONPATH=str(site))
    assert result == {"subclass": True, "tasks": 2, "max_turns": 3, "errors": {}}
    run = subprocess.run(
        [sys.executable, "-m", "agentgym_opd.cli", "train", "--algo", "my_opd", "--env", "nsplugin/train",
         "--student", "tiny", "--teacher", "tiny", "--output-dir", str(tmp_path / "run"), "--no-progress",
         "train.steps=1", "rollout.tasks_per_step=1", "rollout.max_new_tokens=4", "model.device=cpu"],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") >= 1

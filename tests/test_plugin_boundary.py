"""The core never imports a plugin package by name (DESIGN.md): read every import of ``agentgym_opd/`` with ast.

Built-in environments, algorithms and the evaluation commands are found through entry points exactly as a
third party's would be; an import of ``environments``, ``algorithms`` or ``evaluation`` from the core
(module level or inside a function) would make the core depend on them."""

from __future__ import annotations

import ast
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
    assert commands["bench"] == "evaluation.bench.command" and commands["eval"] == "evaluation.eval_command"
    import evaluation.bench.command as bench

    assert bench.HELP and callable(bench.add_arguments) and callable(bench.run)
    assert not (ROOT / "agentgym_opd" / "commands" / "bench.py").exists()

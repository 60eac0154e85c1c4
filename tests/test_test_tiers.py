"""The quick tier: `python -m pytest -m "not slow"` leaves out every heavy test and still runs most of them.

Read statically (no test is run or imported): a test is heavy when it, a fixture it uses (autouse ones
included) or a helper it calls launches torchrun, spawns processes with torch.multiprocessing, or starts a
Ray cluster: each of those costs more than the whole quick tier should on a 2-core machine. Other heavy tests
(training runs, bench subprocesses, JVMs, Chromium) are marked by measurement, which no static rule replaces;
this guards the launches a new test is most likely to add unmarked.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

TESTS = Path(__file__).resolve().parent
TORCHRUN = {"torchrun", "torch.distributed.run"}  # as an element of a command line
HEAVY_CALLS = {"mp.spawn", "torch.multiprocessing.spawn", "ray.init"}


def _launches_here(node: ast.AST) -> bool:
    """A torchrun command line, a spawn of ranks, or a Ray cluster started inside `node`."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.List) and any(isinstance(e, ast.Constant) and e.value in TORCHRUN for e in inner.elts):
            return True
        if isinstance(inner, ast.Call) and ast.unparse(inner.func) in HEAVY_CALLS:
            return True
    return False


def _is_slow(decorators: list[ast.expr]) -> bool:
    return any("mark.slow" in ast.unparse(d) for d in decorators)


def _module_is_slow(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
               and "mark.slow" in ast.unparse(n.value) for n in tree.body)


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _launches(name: str, functions: dict[str, ast.FunctionDef], seen: set[str]) -> bool:
    """Whether function `name` launches torchrun, ranks or Ray itself, or through a module-level function it
    calls or a fixture it takes as an argument."""
    if name in seen or name not in functions:
        return False
    seen.add(name)
    node = functions[name]
    if _launches_here(node):
        return True
    called = {n.func.id for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    arguments = {a.arg for a in node.args.args}
    return any(_launches(other, functions, seen) for other in called | arguments)


def _tier(path: Path) -> tuple[list[str], list[str]]:
    """(slow test names, quick test names) of one test file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = _functions(tree)
    tests = [f for name, f in functions.items() if name.startswith("test_")]
    if _module_is_slow(tree):
        return [t.name for t in tests], []
    slow = [t.name for t in tests if _is_slow(t.decorator_list)]
    return slow, [t.name for t in tests if t.name not in slow]


def test_the_slow_marker_is_registered():
    config = tomllib.loads((TESTS.parent / "pyproject.toml").read_text(encoding="utf-8"))
    markers = config["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("slow:") for m in markers)


def test_every_test_that_launches_torchrun_spawns_ranks_or_starts_ray_is_slow():
    unmarked = []
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        functions = _functions(tree)
        autouse = [name for name, f in functions.items() if "autouse=True" in " ".join(map(ast.unparse, f.decorator_list))]
        _, quick = _tier(path)
        for name in quick:
            if _launches(name, functions, set()) or any(_launches(a, functions, set()) for a in autouse):
                unmarked.append(f"{path.name}::{name}")
    assert unmarked == [], f"mark these @pytest.mark.slow (they launch torchrun, spawn ranks or start Ray): {unmarked}"


def test_the_quick_tier_keeps_most_tests_and_leaves_out_a_real_share():
    slow, quick = [], []
    for path in sorted(TESTS.glob("test_*.py")):
        s, q = _tier(path)
        slow += s
        quick += q
    assert len(slow) >= 50, f"only {len(slow)} test functions are marked slow"
    # at least three quarters of the test functions stay in the quick tier (580 of 711 when this was written)
    assert len(quick) >= 3 * len(slow), f"{len(quick)} quick test functions against {len(slow)} slow ones"

"""Namespaced import names: ``agentgym_opd.algorithms`` is the top-level ``algorithms`` package, the same object.

The repository keeps its plugin packages at the top level (``algorithms``, ``environments``, ``evaluation``,
``experience_bank``: the card's layout, and the entry points a third party's plugin mirrors), but the names a
plugin author imports should all start with the distribution's own, ``agentgym_opd``::

    from agentgym_opd.algorithms.opd import OPD
    from agentgym_opd.environments.household import HouseholdEnv

`install` (called by ``agentgym_opd/__init__.py``) puts `AliasFinder` first on ``sys.meta_path``. It answers an
import of ``agentgym_opd.<package>[.<sub>...]``, for the packages in `ALIASED_PACKAGES` only, with the module
under its real name ``<package>[.<sub>...]``, imported then if it was not yet. One module object under two
names, never a second copy: ``agentgym_opd.algorithms.opd.OPD is algorithms.opd.OPD``, so isinstance checks,
the registries and module globals (what a test monkeypatches) are shared whichever name was imported first,
and a class pickles under its real name (``algorithms.opd.OPD``), which worker processes import either way.

Why a finder, not re-exporting modules: a module file ``agentgym_opd/algorithms.py`` doing ``from algorithms
import *`` would alias one level only, and importing the same files a second time under the new name (a path
entry) would make two copies of every class and registry. Why not import the packages eagerly: the core never
imports a plugin package by itself (DESIGN.md; ``tests/test_plugin_boundary.py``), and the finder maps a name
only when that name is imported.

The loader hands the import system the real module and then restores that module's own ``__spec__`` (the
import system stamps the alias's spec on whatever a loader returns), so ``module.__name__`` and
``module.__spec__.name`` stay the real name. ``python -m agentgym_opd.<package>.<module>`` runs the real
module's code, as ``python -m <package>.<module>`` does.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import CodeType, ModuleType

ALIAS_ROOT = "agentgym_opd"
# the top-level packages of this repository reachable as agentgym_opd.<name>
ALIASED_PACKAGES = ("algorithms", "environments", "evaluation", "experience_bank")


def real_name(alias: str) -> str | None:
    """The real module name behind ``agentgym_opd.<package>[.<sub>...]``, or None for any other name."""
    root, dot, rest = alias.partition(".")
    if root != ALIAS_ROOT or not dot or rest.split(".", 1)[0] not in ALIASED_PACKAGES:
        return None
    return rest


class AliasLoader(importlib.abc.Loader):
    """Loads an alias by importing the real module and handing that very object back."""

    def __init__(self, real: str):
        self.real = real
        self._real_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.real)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the real module already ran; undo the one attribute the import system overwrote (``__spec__``)
        module.__spec__ = self._real_spec

    def get_code(self, fullname: str) -> CodeType | None:
        """The real module's code (``python -m agentgym_opd.<package>.<module>``, through runpy)."""
        spec = importlib.util.find_spec(self.real)
        loader = spec.loader if spec is not None else None
        return loader.get_code(self.real) if loader is not None and hasattr(loader, "get_code") else None


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``agentgym_opd.<package>[.<sub>...]`` wherever the real module is; nothing else."""

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        real = real_name(fullname)
        if real is None:
            return None
        if real in sys.modules:
            module = sys.modules[real]
            is_package, origin = hasattr(module, "__path__"), getattr(module, "__file__", None)
        else:
            real_spec = importlib.util.find_spec(real)  # imports the real parent package, as importing `real` would
            if real_spec is None:  # no such module: the usual "No module named 'agentgym_opd....'"
                return None
            is_package, origin = real_spec.submodule_search_locations is not None, real_spec.origin
        # origin: where the code is (runpy's sys.argv[0]); no location, so the module's own __file__ is kept
        return importlib.machinery.ModuleSpec(fullname, AliasLoader(real), origin=origin, is_package=is_package)


def install() -> AliasFinder:
    """Put the finder first on ``sys.meta_path`` (once per process); returns it.

    First, because the path-based finder would otherwise find ``agentgym_opd.evaluation.bench`` in the real
    package's folder (the parent's ``__path__``) and load those files again as a second module."""
    for finder in sys.meta_path:
        if isinstance(finder, AliasFinder):
            return finder
    finder = AliasFinder()
    sys.meta_path.insert(0, finder)
    return finder

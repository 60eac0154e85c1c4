"""One process's copies of fast-downward's library, reused game after game.

Why: TextWorld's `PddlEnv` calls `fast_downward.load_lib()` once per game, which copies `libdownward.so`
(33 MB) to a temporary file, loads it and deletes the file, so that each game has its own copy of the library's
global state (the task it plans on). ctypes never unloads a library, so every game used to leave 33 MB of
deleted-but-mapped file in its process: a bench worker that evaluates a few hundred games filled the disk. Here a
game's copy goes back to a free list when its `PddlEnv` is garbage-collected (not at `close`: TextWorld may load a
closed environment again), and the next game takes it (loading a task replaces the old one); a new copy is loaded
only when every copy belongs to a live game.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_free: list[Any] = []
_lock = threading.Lock()
_installed = False
loaded = 0  # copies this process has loaded


def install() -> None:
    """Route `fast_downward.load_lib` through the free list; a `PddlEnv`'s copy returns to it when the environment
    is collected (once per process)."""
    global _installed
    if _installed:
        return
    import fast_downward
    from textworld.envs.pddl.pddl import PddlEnv

    load_new = fast_downward.load_lib
    init_env = PddlEnv.__init__

    def load_lib() -> Any:
        global loaded
        with _lock:
            if _free:
                return _free.pop()
            loaded += 1
        return load_new()

    def give_back(lib: Any) -> None:
        with _lock:
            _free.append(lib)

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        init_env(self, *args, **kwargs)
        weakref.finalize(self, give_back, self.downward_lib)

    fast_downward.load_lib = load_lib
    PddlEnv.__init__ = init
    _installed = True

"""TextWorld's slow pure steps, memoised: a game's PDDL-to-SAS translation and the parsing of grammar text.

Why: in a profile of the real-LM track's evaluation (SmolLM2 on 12 ALFWorld games) the environment took more
CPU than the model. Two pure functions of text did most of it:

- fast-downward's ``pddl2sas`` (0.8 s a call): TextWorld translates a game's PDDL problem four times per reset
  (loading the game builds a state and resetting builds another; each state translates once plain and once
  optimised for replanning), the same two translations twice over, and every evaluated row replays the same games;
- TatSu parses of grammar and logic text (3 ms a parse): each step derives every admissible command's text from
  its template, parsing the same few hundred template strings thousands of times a game.

Both are memoised here by their arguments. Callers get fresh objects every time, exactly what a new call would
build (the translation is kept pickled and unpickled per call; a parse result is deep-copied), because TextWorld
mutates what these functions return (a derived command template is written back onto its action). Translations
are also kept on disk (``$AGENTGYM_OPD_CACHE/alfworld-sas``, zlib-compressed, ~70 KB each, named by a hash of the
inputs and the fast-downward and TextWorld versions), so a second evaluation of the same games, in another process, skips them; a cache file
that does not load is translated again and rewritten. ``install()`` is idempotent and called by the ALFWorld env.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import os
import pickle
import tempfile
import zlib
from collections import OrderedDict
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

PARSE_MEMO_SIZE = 8192  # distinct parsed strings kept per parser (ALFWorld's grammar yields a few hundred)
SAS_MEMO_SIZE = 8  # translations kept in memory (one game's two, and a few games back)

_installed = False


def sas_cache_dir() -> Path:
    root = Path(os.environ.get("AGENTGYM_OPD_CACHE", Path.home() / ".cache" / "agentgym_opd"))
    return root / "alfworld-sas"


def _versions() -> str:
    found = []
    for dist in ("fast_downward_textworld", "textworld"):
        try:
            found.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist}=?")
    return ",".join(found)


def memoised_parse(parse: Callable[..., Any], size: int = PARSE_MEMO_SIZE) -> Callable[..., Any]:
    """``parse`` memoised by its (hashable) arguments; each call returns a deep copy of the kept result."""
    kept: OrderedDict[Any, Any] = OrderedDict()

    @functools.wraps(parse)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            key = (args, tuple(sorted(kwargs.items())))
            hash(key)
        except TypeError:  # an unhashable argument: parse as usual
            return parse(*args, **kwargs)
        if key in kept:
            kept.move_to_end(key)
        else:
            kept[key] = parse(*args, **kwargs)
            if len(kept) > size:
                kept.popitem(last=False)
        return copy.deepcopy(kept[key])

    wrapper.__wrapped_parse__ = parse  # type: ignore[attr-defined]
    return wrapper


def memoised_pddl2sas(translate: Callable[..., Any], cache_dir: Path | None = None,
                      size: int = SAS_MEMO_SIZE) -> Callable[..., Any]:
    """fast-downward's ``pddl2sas(domain, problem, verbose=False, optimize=False)`` memoised in memory and on disk
    by its inputs; every call unpickles its own copy of the ``(task, sas)`` result."""
    kept: OrderedDict[str, bytes] = OrderedDict()
    versions = _versions()

    @functools.wraps(translate)
    def wrapper(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        key = hashlib.sha256("\0".join([versions, str(bool(optimize)), domain, problem]).encode()).hexdigest()
        blob = kept.get(key)
        path = (cache_dir or sas_cache_dir()) / f"{key}.pkl.z"
        if blob is None and path.is_file():
            try:
                blob = path.read_bytes()
                result = _loads(blob)
            except Exception:  # a torn or stale cache file: translate again below and overwrite it
                blob = None
            else:
                _keep(kept, key, blob, size)
                return result
        if blob is not None:
            kept.move_to_end(key)
            return _loads(blob)
        result = translate(domain, problem, verbose=verbose, optimize=optimize)
        blob = zlib.compress(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL), 1)
        _keep(kept, key, blob, size)
        _write_atomically(path, blob)
        return _loads(blob)

    wrapper.__wrapped_translate__ = translate  # type: ignore[attr-defined]
    wrapper.cache_clear = kept.clear  # type: ignore[attr-defined]  # forget the in-memory copies (the disk stays)
    return wrapper


def _loads(blob: bytes) -> Any:
    return pickle.loads(zlib.decompress(blob))


def _keep(kept: OrderedDict[str, bytes], key: str, blob: bytes, size: int) -> None:
    kept[key] = blob
    kept.move_to_end(key)
    while len(kept) > size:
        kept.popitem(last=False)


def _write_atomically(path: Path, blob: bytes) -> None:
    """Write via a temporary file and a rename, so a killed writer leaves no half file; a read-only or full
    cache only costs the next process the translation."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
            tmp.write(blob)
        os.replace(tmp.name, path)
    except OSError:
        pass


def install() -> None:
    """Route TextWorld's PDDL translation and its three text parsers through the memos (once per process)."""
    global _installed
    if _installed:
        return
    import fast_downward
    import textworld.envs.pddl.logic as pddl_logic
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as tw_logic

    fast_downward.pddl2sas = memoised_pddl2sas(fast_downward.pddl2sas)
    for module in (textgen, pddl_logic, tw_logic):
        module._parse_and_convert = memoised_parse(module._parse_and_convert)
    _installed = True

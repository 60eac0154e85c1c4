"""Mixed precision for a Hugging Face causal LM: its forward passes under `torch.autocast` (``model.autocast``).

Why autocast and not bf16 weights (``model.dtype=bfloat16``): AdamW's updates on bf16 weights round away
(bf16 keeps 8 bits of mantissa, an update of 1e-5 on a weight of 0.05 vanishes), so a trained student needs
float32 master weights; autocast keeps them and runs the matrix products in bf16, which is where the time
goes (on a CPU with AVX512-BF16 or AMX, and on GPUs). The backward of an autocast op runs in the op's dtype by
itself, so only the forward needs the context.

Why hooks on the modules: every forward a run makes goes through one of three modules (the whole model, its
body `get_decoder()` that chunked scoring runs, its `lm_head`), called from the policy's decode loop, scoring,
the algorithms' updates and the teachers; hooks on those three put all of them under autocast without each
call site knowing, survive `copy.deepcopy` (an EMA teacher is a copy), and leave ``save_pretrained`` alone.
The head's output is cast back to float32, so log-probs and divergences are taken in float32 from logits
that were computed in bf16 (the precision cost `benchmarks/bench_smollm2_opd_step.py` states).
"""

from __future__ import annotations

from typing import Any

import torch

AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
_MARK = "_agentgym_autocast"


def autocast_dtype(name: str) -> torch.dtype | None:
    """The dtype of a ``model.autocast`` setting ('none' -> None); an unknown name is an error naming the choices."""
    if name in (None, "none", ""):
        return None
    if name not in AUTOCAST_DTYPES:
        raise ValueError(f"unknown model.autocast {name!r}: use none, bfloat16 or float16")
    return AUTOCAST_DTYPES[name]


def autocast_available(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch can autocast to ``dtype`` on this device type (float16 on CPU needs a recent torch)."""
    try:
        with torch.autocast(device_type=device_type, dtype=dtype):
            return True
    except (RuntimeError, ValueError):
        return False


def enable_autocast(model: Any, dtype: str | torch.dtype = "bfloat16") -> Any:
    """Run every forward of ``model`` (whole model, body, output head) under autocast to ``dtype``; returns the
    model. Idempotent; the head's output comes back as float32. The device type is read from the weights at
    each call, so a model moved afterwards still autocasts on its new device."""
    target = autocast_dtype(dtype) if isinstance(dtype, str) else dtype
    if target is None:
        return model
    bare = model.module if hasattr(model, "module") and isinstance(model.module, torch.nn.Module) else model
    modules = [bare]
    for getter in ("get_decoder", "get_output_embeddings"):
        part = getattr(bare, getter, lambda: None)()
        if isinstance(part, torch.nn.Module):
            modules.append(part)
    device_type = _device_type(bare)
    if not autocast_available(device_type, target):
        raise ValueError(f"model.autocast={dtype}: torch cannot autocast to {target} on {device_type}; use none")
    head = modules[-1] if len(modules) == 3 else None
    for module in modules:
        if getattr(module, _MARK, None) is not None:
            continue
        _hook(module, target, cast_output=module is head)
    return model


def autocast_of(model: Any) -> torch.dtype | None:
    """The dtype ``model`` autocasts to, or None."""
    bare = model.module if hasattr(model, "module") and isinstance(model.module, torch.nn.Module) else model
    return getattr(bare, _MARK, None)


def autocast_across_calls(model: Any) -> Any:
    """A context around many forwards of a model that autocasts (a decode's one-token forwards, a chunked head's
    chunks), else a no-op.

    Each hooked forward enters and leaves its own autocast context, and leaving the outermost one drops
    autocast's cache of the weights' bf16 casts: one-token forwards would then cast every weight again per token,
    which made decoding slower than float32 (measured 0.75x), and a chunked output head would cast its [V, H]
    weight again per chunk, forward and backward. Inside one outer context the casts of the trainable
    weights are made once per call (decoding 1.27x, bf16 weights 1.4x: `benchmarks/bench_smollm2_opd_step.py`)."""
    import contextlib

    dtype = autocast_of(model)
    if dtype is None:
        return contextlib.nullcontext()
    bare = model.module if hasattr(model, "module") and isinstance(model.module, torch.nn.Module) else model
    return torch.autocast(device_type=_device_type(bare), dtype=dtype)


def store_frozen_projections(model: Any) -> int:
    """Keep the weights of a frozen model's projections (``nn.Linear``) in its autocast dtype; returns how many.

    Why: autocast caches its bf16 cast of a weight only for a leaf that requires grad, so a frozen model (a
    teacher, a frozen reference row, a judge) casts every projection's weights again at every forward, and a
    decode of one-token forwards then runs no faster than float32 (one 576x6144 projection, one thread: 1.35 ms
    per call frozen, 0.41 ms trainable, 1.75 ms float32). Stored in the autocast dtype there is nothing to cast,
    and the products are the same numbers (autocast would round the weight to that dtype anyway). An output head
    tied to the input embedding gets its own copy in that dtype (the embedding, like the norms, stays float32,
    as autocast runs them); the head is a fifth of SmolLM2's weights, cast at every token otherwise. Only for
    a model that never trains: call it after ``requires_grad_(False)``; a model with any trainable parameter is
    refused."""
    dtype = autocast_of(model)
    if dtype is None:
        return 0
    bare = model.module if hasattr(model, "module") and isinstance(model.module, torch.nn.Module) else model
    if any(p.requires_grad for p in bare.parameters()):
        raise ValueError("store_frozen_projections: the model has trainable parameters; their float32 master "
                         "weights must stay (freeze it first, or keep float32 storage)")
    outside = {id(p) for m in bare.modules() if not isinstance(m, torch.nn.Linear)
               for p in m.parameters(recurse=False)}
    stored = 0
    for module in bare.modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        for name, param in list(module.named_parameters(recurse=False)):
            copy = param.detach().to(dtype)
            if id(param) in outside:  # tied: the head's own copy, the other module keeps float32
                copy = copy.clone() if copy.data_ptr() == param.data_ptr() else copy
            setattr(module, name, torch.nn.Parameter(copy, requires_grad=False))
        stored += 1
    return stored


def _device_type(module: torch.nn.Module) -> str:
    param = next(module.parameters(), None)
    return param.device.type if param is not None else "cpu"


def _hook(module: torch.nn.Module, dtype: torch.dtype, *, cast_output: bool) -> None:
    """Enter autocast before ``module``'s forward and leave it after (also when the forward raises)."""
    contexts: list[Any] = []  # a stack: a forward that calls a hooked submodule nests its own context

    def enter(mod: torch.nn.Module, args: Any) -> None:
        context = torch.autocast(device_type=_device_type(mod), dtype=dtype)
        context.__enter__()
        contexts.append(context)

    def leave(mod: torch.nn.Module, args: Any, output: Any) -> Any:
        contexts.pop().__exit__(None, None, None)
        if cast_output and isinstance(output, torch.Tensor) and output.is_floating_point():
            return output.float()
        return None

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave, always_call=True)
    setattr(module, _MARK, dtype)

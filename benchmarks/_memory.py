"""Peak bytes of tensors created inside a block: an exact, allocator-independent measure that works on CPU.

A `TorchDispatchMode` sees every tensor an operator returns (forward and backward alike, since CPU
autograd runs on the calling thread); each new storage counts from its creation until its last reference
goes. Tensors that existed before the block (the weights) do not count, so the number is what one step
adds on top of the model. Used by the memory benchmarks, never by the package.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _tensors(value, found: list) -> list:
    """The tensors in nested tuples/lists/dicts. (Not `torch.utils._pytree.tree_flatten`: its recursive
    closure makes a reference cycle that would keep every output alive until the cyclic GC runs.)"""
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        for item in value:
            _tensors(item, found)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors(item, found)
    return found


class PeakTensorBytes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {v.untyped_storage().data_ptr() for v in _tensors((args, kwargs), []) if v.device.type != "meta"}
        for value in _tensors(out, []):
            if value.device.type == "meta":
                continue
            storage = value.untyped_storage()
            key = storage.data_ptr()
            if key in inputs:  # a view of an input (or an in-place result): no new memory
                continue
            if key in self._sizes or storage.nbytes() == 0:
                continue
            self._sizes[key] = storage.nbytes()
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key)
        return out

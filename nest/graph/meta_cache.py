"""Aten call on meta tensors -> its outputs' layout, remembered: a trace's meta kernels run once
per distinct call.

A layer trace (nest.graph.fx_extract) runs every aten operator on the meta device, where a
kernel only infers its outputs' sizes, strides and dtype from its inputs' -- in Python (torch's
reference implementations), most of a trace's time. The same calls recur: the selective
recomputation pass repeats the forward, an expert-parallel variant repeats the attention of
the one before, a tensor-parallel degree the shapes of another layer kind. For an operator that
neither writes nor aliases any input and returns only fresh tensors (its schema says so), the
output layout is a function of the call's inputs' layouts and its other arguments; the second
time, `call` allocates the remembered layout (torch.empty_strided on the meta device) instead
of running the kernel. Outputs that are not a plain fresh allocation (an offset, a storage of
another size) are never remembered. nothing else changes: an output is a new storage as the
kernel's would be, and autograd and the trace's meter see the same tensors.
"""

from __future__ import annotations

import importlib
import sys
import types
from contextlib import contextmanager

import torch

ENTRIES = 200_000  # distinct calls remembered (a few hundred bytes each), then forgotten at once
_LAYOUTS: dict = {}
_PURE: dict = {}  # operator -> whether its schema makes it cacheable
hits = 0  # calls served from _LAYOUTS (for tests)


def _pure(func) -> bool:
    hit = _PURE.get(func)
    if hit is None:
        s = func._schema
        hit = _PURE[func] = (not s.is_mutable and not func.is_view
                             and all(a.alias_info is None for a in s.arguments)
                             and len(s.returns) > 0
                             and all(r.alias_info is None and str(r.type) == "Tensor"
                                     for r in s.returns))
    return hit


_SCALARS = frozenset({bool, int, float, str, torch.dtype, torch.device, torch.layout,
                      torch.memory_format, type(None)})


def _spec(x):
    """A hashable description of an argument, or None if it has no exact one."""
    if isinstance(x, torch.Tensor):
        if not x.is_meta:
            return None
        return ("T", x.shape, x.stride(), x.dtype, x.storage_offset())
    tx = type(x)
    if tx is tuple or tx is list or tx is torch.Size:
        out = tuple(map(_spec, x))
        return None if None in out else (tx, out)
    if tx in _SCALARS:
        return (tx, x)
    return None


def _layout(t: torch.Tensor):
    """(size, stride, dtype) of a fresh meta allocation, or None for anything else."""
    if not isinstance(t, torch.Tensor) or t.device.type != "meta" or t.storage_offset():
        return None
    size, stride = tuple(t.shape), t.stride()
    span = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
    if t.untyped_storage().nbytes() != span * t.element_size():
        return None
    return size, stride, t.dtype


def _storage(t) -> int | None:
    return t.untyped_storage()._cdata if isinstance(t, torch.Tensor) else None


def _flat(x) -> list:
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _flat(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _flat(y)]
    return [x] if isinstance(x, torch.Tensor) else []


def call(func, args, kwargs):
    """func(*args, **kwargs), from the remembered layout when the call was seen before."""
    if not _pure(func):
        return func(*args, **kwargs)
    key = (func, _spec(args), _spec(tuple(sorted(kwargs.items()))))
    if key[1] is None or key[2] is None:
        return func(*args, **kwargs)
    hit = _LAYOUTS.get(key)
    if hit is not None:
        global hits
        hits += 1
        many, layouts = hit
        outs = tuple(torch.empty_strided(size, stride, dtype=dtype, device="meta")
                     for size, stride, dtype in layouts)
        return outs if many else outs[0]
    out = func(*args, **kwargs)
    many = isinstance(out, tuple)
    outs = out if many else (out,)
    if {_storage(t) for t in outs} & {_storage(t) for t in _flat((args, kwargs))}:
        _PURE[func] = False  # returns an input's storage whatever its schema says (_unsafe_view)
        return out
    layouts = tuple(_layout(t) for t in outs)
    if all(x is not None for x in layouts):
        if len(_LAYOUTS) >= ENTRIES:
            _LAYOUTS.clear()
        _LAYOUTS[key] = (many, layouts)
    return out


class _DynamoStandIn(types.ModuleType):
    """torch._dynamo while a trace runs and nothing has loaded it (`without_dynamo`)."""

    def __init__(self):
        super().__init__("torch._dynamo")
        self.wrapped: list = []  # the kernels torch._compile._disable_dynamo asked to disable

    def disable(self, fn=None, recursive=True, *args, **kwargs):
        """torch._dynamo.disable where no frame is ever compiled: the function itself."""
        if fn is None:
            return lambda f: self.disable(f, recursive)
        self.wrapped.append(fn)
        return fn

    def __getattr__(self, name):  # anything else: the real module, loaded now
        return getattr(_real_dynamo(), name)


def _real_dynamo():
    if isinstance(sys.modules.get("torch._dynamo"), _DynamoStandIn):
        del sys.modules["torch._dynamo"]
    if isinstance(vars(torch).get("_dynamo"), _DynamoStandIn):
        delattr(torch, "_dynamo")
    return importlib.import_module("torch._dynamo")


@contextmanager
def without_dynamo():
    """Run meta kernels without importing torch._dynamo (about 1 CPU s, a tenth of planning a
    large MoE model).

    On torch 2.x most meta kernels of a trace are torch._refs functions (every elementwise op,
    cat, where, clamp, softmax backward, ...) wrapped by torch._compile._disable_dynamo, whose
    first call imports torch._dynamo only to wrap the kernel in torch._dynamo.disable, then keeps
    that wrapper on the kernel (its `__dynamo_disable` attribute). torch._dynamo.disable only
    matters to frames torch.compile traces; nothing here compiles, so the kernel itself is the
    same function. While torch._dynamo is not loaded, this puts a stand-in in sys.modules whose
    `disable` returns the kernel (any other attribute loads the real module and defers to it),
    and on leaving removes the stand-in and the attributes torch kept on the kernels, so torch
    is as it was: a later import of torch._dynamo, or torch.compile, sees nothing of it. Where
    torch._dynamo is loaded already, nothing changes. tests/test_meta_cache.py checks that a
    trace leaves torch._dynamo unloaded and that its record equals one traced with the real
    module."""
    if "torch._dynamo" in sys.modules:
        yield
        return
    stand_in = _DynamoStandIn()
    sys.modules["torch._dynamo"] = stand_in
    try:
        yield
    finally:
        if sys.modules.get("torch._dynamo") is stand_in:
            del sys.modules["torch._dynamo"]
        if vars(torch).get("_dynamo") is stand_in:
            delattr(torch, "_dynamo")
        for fn in stand_in.wrapped:
            kept = getattr(fn, "__dict__", {})
            if kept.get("__dynamo_disable") is fn:
                del kept["__dynamo_disable"]

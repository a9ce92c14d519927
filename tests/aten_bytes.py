"""Every aten call PyTorch dispatches inside a `with AtenLog() as log:` block, with the bytes it
moves: the tensors it reads plus those it writes (views and allocations excluded, and calls on
0-dim scalars only). Tests use it to count an eager code path's kernels and
traffic another way than the cost model's closed forms."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten calls that move no data: views, allocations, detaches
FREE = ("narrow", "slice", "as_strided", "split", "chunk", "view", "_unsafe_view", "expand",
        "unsqueeze", "t", "scalar_tensor", "empty", "detach", "alias", "lift_fresh")


def _tensors(xs) -> list[torch.Tensor]:
    out = []
    for a in xs:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += [t for t in a if isinstance(t, torch.Tensor)]
    return out


class AtenLog(TorchDispatchMode):
    """calls: [(aten name, bytes read + written)] in dispatch order."""

    def __init__(self, free: tuple[str, ...] = FREE):
        super().__init__()
        self.free = free
        self.calls: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if name not in self.free:
            moved = [t for t in _tensors(args) + _tensors([out]) if t.dim() > 0]
            if moved:  # not a call on 0-dim scalars only
                self.calls.append((name, sum(t.numel() * t.element_size() for t in moved)))
        return out

    @property
    def nbytes(self) -> int:
        return sum(b for _, b in self.calls)

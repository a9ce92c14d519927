"""Tensor- and context-parallel degrees above 4 derived from the traces at degree 2 and 4.

Under tp = t a device holds a / t heads, kv / t KV heads, f / t of every MLP width and vocab / t
of the embedding and LM head (with sequence parallelism also s / t tokens outside the tensor-
parallel regions); under cp = c, s / c local tokens (K and V gathered back to s). Every tensor
of a layer trace has at most one such split dimension (a gathered tensor has the whole size),
so every measured integer (nest.graph.fx_extract's records: FLOPs and bytes per node and phase,
saved bytes, collective bytes, operator shapes, parameters) is a + b / d in the degree d, all
else fixed: two traces in the same structural class (d = 2 and d = 4: the same collectives,
the same fx nodes) fix it, x(d) = x(4) + (x(2) - x(4)) (4 - d) / d, in integers. The split
must be exact for this: d divides the vocabulary (else the vocab shard is rounded up) and the
MoE slots per expert stay an integer at a traced micro-batch (batch- or slot-tagged records,
nest.graph.fx_batch, derive from bases tagged alike); the variant checks of
nest.graph.torch_models (heads, widths, sequence) run as for a trace. The sequence-parallel
all-to-all divisor (t) follows the degree. tests/test_fx_split.py compares every derived variant
of several models with its trace; a record pair outside the pattern is traced instead.
"""

from __future__ import annotations

import dataclasses

BASE = (2, 4)


class _NotAffine(Exception):
    pass


def derivable(m, v, axis: str, mbs: int | None) -> bool:
    """Degree `axis` (tp | cp) of `v` derivable from degrees 2 and 4 (mbs: the traced micro-
    batch, None when batch-tagged)."""
    d = getattr(v, axis)
    if d <= BASE[1] or d & (d - 1):
        return False
    if axis == "tp" and m.vocab_size % d:
        return False
    if m.is_moe:
        s_loc = m.seq_len // v.cp
        if s_loc * v.cp != m.seq_len:
            return False
        if mbs is None:  # batch- or slot-tagged (nest.graph.fx_batch): the cap is its own symbol
            return True
        return mbs * s_loc * m.top_k % m.num_experts == 0
    return True


def bases(v, axis: str):
    return tuple(dataclasses.replace(v, **{axis: b}) for b in BASE)


def _fit(x2: int, x4: int, d: int) -> int:
    num = (x2 - x4) * (BASE[1] - d)
    if num % d:
        raise _NotAffine
    x = x4 + num // d
    if x < 0:
        raise _NotAffine
    return x


def _poly(p2, p4, d):
    a, b = dict(p2), dict(p4)
    out = ((k, _fit(a.get(k, 0), b.get(k, 0), d)) for k in sorted(set(a) | set(b)))
    return tuple((k, c) for k, c in out if c)


def _dict(d2: dict, d4: dict, d: int) -> dict:
    if set(d2) != set(d4):
        raise _NotAffine
    return {k: _poly(d2[k], d4[k], d) for k in d4}


def _num(x2: float, x4: float, d: int) -> float:
    if not (x2.is_integer() and x4.is_integer()):
        raise _NotAffine
    return float(_fit(int(x2), int(x4), d))


def derive(r2, r4, v, axis: str):
    """The record at variant v from the records at degree 2 and 4 of `axis` (None: trace)."""
    d = getattr(v, axis)
    try:
        if len(r2.nodes) != len(r4.nodes) or len(r2.comms) != len(r4.comms):
            raise _NotAffine
        nodes = []
        for n2, n4 in zip(r2.nodes, r4.nodes):
            if n2[:7] != n4[:7] or len(n2[7]) != len(n4[7]):
                raise _NotAffine
            nodes.append((*n4[:7], tuple(_poly(a, b, d) for a, b in zip(n2[7], n4[7]))))
        comms = []
        for c2, c4 in zip(r2.comms, r4.comms):
            if c2[:3] != c4[:3]:
                raise _NotAffine
            shard = c4[4] if c2[4] == c4[4] else (d if (c2[4], c4[4]) == BASE else None)
            if shard is None:
                raise _NotAffine
            comms.append((*c4[:3], _poly(c2[3], c4[3], d), shard))
        if set(r2.mm_shapes) != set(r4.mm_shapes):
            raise _NotAffine
        mm = {k: tuple(_poly(a, b, d) for a, b in zip(r2.mm_shapes[k], r4.mm_shapes[k]))
              for k in r4.mm_shapes}
        return dataclasses.replace(
            r4, variant=v, nodes=nodes, flops=_dict(r2.flops, r4.flops, d),
            nbytes=_dict(r2.nbytes, r4.nbytes, d), mm_shapes=mm,
            out_bytes=_dict(r2.out_bytes, r4.out_bytes, d), comms=comms,
            act=_dict(r2.act, r4.act, d), boundary=_poly(r2.boundary, r4.boundary, d),
            params=tuple(_num(a, b, d) for a, b in zip(r2.params, r4.params)))
    except _NotAffine:
        return None

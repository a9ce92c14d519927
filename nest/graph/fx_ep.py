"""Expert-parallel variants of a traced MoE layer derived from two traces (ep = 2 and ep = 4)
instead of one torch.fx trace per ep.

Under ep = e (nest.graph.torch_models.MoE) a device holds n = E / e local experts and, after the
all-to-all, every one of them sees e * cap token slots (cap: slots per expert on this device,
independent of e). So, with everything else about the variant fixed:
* the expert GEMMs: op.count = n, their m dimension = e * cap; a node's FLOPs and activation
  bytes are those of E * cap slots (constant), its weight and weight-gradient bytes n times one
  expert's: every per-node total is a + b * n;
* expert parameters are b * n, dense ones constant; the all-to-all buffers are [E, cap, h]
  either way (constant bytes, the same count); saved activations and the boundary output are
  constant (the dispatched tensor has the size of the permuted one).
Every number is therefore affine in n (constant where it does not depend on n) and two traces
fix it: b = (x(2) - x(4)) / (E/2 - E/4), x(e) = x(4) + b * (E/e - E/4), integers in floats below
2^53, so exact. The per-op values are then the derived totals divided by count, the same
division the trace does. tests/test_fx_ep.py builds every family fixture and the catalog MoE
models both ways and asserts identical layer tables for every variant. Anything that does not
fit the pattern (a different op list, a non-integer slope, a shape that is not 2x) is traced.
"""

from __future__ import annotations

import dataclasses

from nest.graph.layer_graph import Collective, LayerCost, Op, Variant

BASE = (2, 4)  # the two traced ep (ep = 1 has no all-to-all: a different op list)


class _NotAffine(Exception):
    pass


def can_derive(num_experts: int, v: Variant) -> bool:
    """ep is derivable from the ep = 2 and ep = 4 traces of the same (tp, sp, cp)."""
    return v.ep > BASE[1] and num_experts % v.ep == 0 and num_experts % BASE[1] == 0


def bases(v: Variant) -> tuple[Variant, Variant]:
    return tuple(dataclasses.replace(v, ep=e) for e in BASE)


def derive(t2, t4, num_experts: int, ep: int) -> LayerCost | None:
    """The LayerCost at `ep` from the TracedLayers at ep = 2 and 4 (None: trace it instead)."""
    n2, n4, n = num_experts // BASE[0], num_experts // BASE[1], num_experts // ep

    def lin(x2: float, x4: float) -> float:
        if x2 == x4:
            return x4
        b = (x2 - x4) / (n2 - n4)
        if b != int(b) or abs(x2) >= 2.0 ** 52 or abs(x4) >= 2.0 ** 52:
            raise _NotAffine
        return x4 + b * (n - n4)

    def scaled(s2: int, s4: int) -> int:
        if s2 == s4:
            return s4
        if s4 != 2 * s2 or s4 % BASE[1]:
            raise _NotAffine
        return s4 // BASE[1] * ep

    c2, c4 = t2.cost, t4.cost
    try:
        if (len(c2.ops) != len(c4.ops) or len(t2.op_totals) != len(c2.ops)
                or len(t4.op_totals) != len(c4.ops) or len(c2.collectives) != len(c4.collectives)
                or c2.recompute_ops != c4.recompute_ops or set(c2.act_bytes) != set(c4.act_bytes)):
            raise _NotAffine
        ops = []
        for o2, o4, x2, x4 in zip(c2.ops, c4.ops, t2.op_totals, t4.op_totals):
            if (o2.name, o2.kind, len(o2.shape)) != (o4.name, o4.kind, len(o4.shape)):
                raise _NotAffine
            if o2.count == o4.count:
                count = o4.count
            elif (o2.count, o4.count) == (n2, n4):
                count = n
            else:
                raise _NotAffine
            f_fl, b_fl, f_by, b_by = (lin(a, b) for a, b in zip(x2, x4))
            ops.append(Op(o4.name, o4.kind, f_fl / count, b_fl / count, f_by / count,
                          b_by / count, tuple(scaled(a, b) for a, b in zip(o2.shape, o4.shape)),
                          count))
        colls = []
        for k2, k4 in zip(c2.collectives, c4.collectives):
            if (k2.kind, k2.phase, k2.group, k2.count) != (k4.kind, k4.phase, k4.group, k4.count):
                raise _NotAffine
            colls.append(Collective(k4.kind, k4.phase, k4.group, lin(k2.bytes, k4.bytes),
                                    k4.count))
        return LayerCost(tuple(ops), tuple(colls), lin(c2.dense_params, c4.dense_params),
                         lin(c2.expert_params, c4.expert_params),
                         {k: lin(c2.act_bytes[k], c4.act_bytes[k]) for k in c4.act_bytes},
                         dict(c4.recompute_ops), lin(c2.output_bytes, c4.output_bytes))
    except _NotAffine:
        return None

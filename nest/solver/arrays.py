"""Problem x (variant, p, d, placement) -> stage cost arrays over every cut and memory knob.

A view of the one stage kernel (nest.costs.stage.stage_cost on the whole [b, a] grid), per stage
position j of a fixed placement:
    t[j, b, a, o]    time per micro-batch of stage j covering layers a..b with option o
    u[j, b, a, z]    time after the flush: gradient sync + optimizer step (+ tied embedding)
    tail, drain      with dp_overlap stage | bucketed, the overlapped tail's terms per option
                     (nest.costs.stage.overlap_terms)
    ok[j, b, a, o]   a <= b and the stage's peak memory fits in HBM
with o = z_index * R + r_index (nest.costs.stage.Options) over the space's ZeRO stages and
recomputation modes. Array legend: J stage positions, L layers (b: last layer, a: first layer),
O options, Z ZeRO stages, R recomputation modes. Reductions run over the last axes (fast on CPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from nest.costs.layers import LayerTable
from nest.costs.pipeline import links, stash
from nest.costs.stage import Options, stage_cost
from nest.graph.layer_graph import Variant
from nest.problem.plan import place
from nest.problem.problem import Problem
from nest.problem.space import SearchSpace


@dataclass
class StageArrays:
    t_JLLO: np.ndarray
    u_JLLZ: np.ndarray
    ok_JLLO: np.ndarray
    device_ids: list[tuple[int, ...]]
    num_microbatches: int
    options: Options
    # dp_overlap stage | bucketed only: the kernel's `tail` and `drain` per option, [J, L, L, O]
    # (nest.costs.stage.overlap_terms; nest.solver.overlap)
    tail_JLLO: np.ndarray | None = None
    drain_JLLO: np.ndarray | None = None


def stage_arrays(problem: Problem, space: SearchSpace, la: LayerTable, v: Variant, p: int,
                 d: int, placement: str) -> StageArrays:
    """One variant for every stage."""
    return class_arrays(problem, space, [la], p, d, placement)


def class_arrays(problem: Problem, space: SearchSpace, lts: list[LayerTable], p: int, d: int,
                 placement: str) -> StageArrays:
    """Every stage picks a variant of the class (same width and ep, so the same devices per
    position) as part of its option: o = variant_index * Z * R + z_index * R + r_index, and
    u[..., variant_index * Z + z_index]."""
    v, L = lts[0].variant, lts[0].num_layers
    opts = space.options
    m = problem.num_microbatches(d, v.ep)
    ids = place(p, d, v.width, placement, tp=v.tp, cp=v.cp, ep=v.ep)
    valid_LL = np.tril(np.ones((L, L), dtype=bool))[..., None]  # a <= b
    hbm = problem.cluster.hardware.hbm_bytes
    out: dict[str, np.ndarray] = {}  # [J, L, L, ...] arrays, written in place position by position

    def put(name: str, j: int, k: int, x: np.ndarray, dtype=float):
        if name not in out:
            out[name] = np.empty((p, *x.shape[:-1], x.shape[-1] * len(lts)), dtype=dtype)
        w = x.shape[-1]
        out[name][j, ..., k * w:(k + 1) * w] = x

    for j in range(p):
        for k, la in enumerate(lts):
            c = stage_cost(problem, la, ids[j], d, opts, stash(p, j, m), **links(ids, j))
            put("t", j, k, c.t.reshape(L, L, -1))
            put("ok", j, k, (c.mem <= hbm).reshape(L, L, -1) & valid_LL, bool)
            put("u", j, k, c.u)
            if c.tail is not None:
                put("e", j, k, c.tail.reshape(L, L, -1))
                put("r", j, k, c.drain.reshape(L, L, -1))
    return StageArrays(out["t"], out["u"], out["ok"], ids, m, opts, out.get("e"), out.get("r"))


def even_cut_mask(problem: Problem, p: int) -> np.ndarray:
    """mask[b, a]: layers a..b may form one stage of a p-stage pipeline with even cuts (the
    `even_cuts` solver setting): the stage holds floor(B / p) or ceil(B / p) of the B transformer
    blocks (p <= B; with more stages than blocks nothing passes). Embedding and head layers are
    not counted, so they ride with the first and the last stage (a stage of the DP starting at
    layer 0 is the first, one ending at the last layer the last). Every most-even split passes (any stages may take the extra blocks), and only
    those: cuts into p stages whose block counts are all floor or ceil sum to B exactly then."""
    is_block = np.array([la.kind == "block" for la in problem.graph.layers], dtype=np.int64)
    B = int(is_block.sum())
    cum = np.concatenate([[0], np.cumsum(is_block)])
    blocks_LL = cum[1:][:, None] - cum[:-1][None, :]  # [b, a]: blocks among layers a..b
    lo, hi = B // p, -(-B // p)
    L = len(is_block)
    if lo < 1:  # more stages than blocks: no even split (a stage of embedding or head alone)
        return np.zeros((L, L), dtype=bool)
    return (blocks_LL >= lo) & (blocks_LL <= hi) & np.tril(np.ones((L, L), dtype=bool))

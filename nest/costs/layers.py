"""Layer graph x variant -> per-layer vectors and [last, first] range tables of a stage's layers.

Part of the stage kernel (nest.costs.stage): compute per layer (fwd, bwd, recomputed fwd per mode,
nest.costs.table), saved activations and working sets, dense / expert parameters (the tied
embedding counted once on a stage holding both ends: nest.costs.memory.tied_embedding_params),
boundary bytes, and their range sums / maxima over every stage a..b, indexed [b, a].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from nest.costs.cache import read_only
from nest.costs.memory import tied_embedding_params
from nest.costs.table import FREED_MODES, LayerTimes, module_freed_bytes
from nest.graph.layer_graph import RECOMPUTE_MODES, Variant


@dataclass(frozen=True, eq=False)
class LayerTable:
    """Per-layer vectors of one variant and their range tables over every stage a..b (built by
    `layer_table`, kept in the problem's nest.costs.cache.ProblemCache; every array read-only)."""

    variant: Variant
    modes: tuple[str, ...]
    fwd_L: np.ndarray  # forward compute per layer, seconds
    bwd_L: np.ndarray
    rec_LR: np.ndarray  # recomputed forward per layer and mode
    act_LR: np.ndarray  # bytes saved for backward per micro-batch
    work_LR: np.ndarray  # act(none) - act(r): working set of a recomputed layer
    dense_L: np.ndarray
    expert_L: np.ndarray
    out_L: np.ndarray  # boundary activation bytes per device (the layer's output)
    costs: tuple  # LayerCost per layer
    tied: float  # tied embedding parameters per device (nest.costs.memory)
    # [b, a] range tables: sums (maxima for work / maxpar) over layers a..b
    pd_LL: np.ndarray
    pe_LL: np.ndarray
    comp_LLR: np.ndarray
    act_LLR: np.ndarray
    work_LLR: np.ndarray
    maxpar_LL: np.ndarray
    fp8_LL: np.ndarray  # parameters of the stage's FP8 GEMMs (its blocks; nest.spec.precision)
    gemm_fwd_L: np.ndarray  # the GEMMs' part of fwd_L / bwd_L (tensor-parallel overlap)
    gemm_bwd_L: np.ndarray
    proj_fwd_L: np.ndarray  # the row-parallel GEMMs' forward (LayerTimes.proj_fwd_s, down_fwd_s)
    down_fwd_L: np.ndarray
    col_bwd_L: np.ndarray  # the column-parallel GEMMs' backward (LayerTimes.col_bwd_s)
    cum: Mapping[str, np.ndarray]  # prefix sums of fwd_L, bwd_L, rec_LR for one-cell breakdowns

    @property
    def num_layers(self) -> int:
        return len(self.dense_L)

    @property
    def comp_LR(self) -> np.ndarray:
        return (self.fwd_L + self.bwd_L)[:, None] + self.rec_LR

    @property
    def store(self) -> tuple:
        """The ProblemCache store of what is derived from this table (nest.costs.cache)."""
        return ("derived", self.variant, self.modes)


ALL_MODES = RECOMPUTE_MODES  # the evaluator's table (nest.problem.evaluate)


def layer_table(problem, v: Variant, modes: tuple[str, ...]) -> LayerTable:
    """The variant's table (kept in the problem's cache, one store per modes: a search that
    walks every variant once per mode keeps them all; the problem must hold the variant). A
    subset of ALL_MODES is the columns of the ALL_MODES table (`mode_columns`)."""
    modes = tuple(modes)
    return problem.cache.get(("layer_tables", modes), v, lambda: _table(problem, v, modes))


def subset_of_all(modes: tuple[str, ...]) -> list[int] | None:
    """Column indices of `modes` in ALL_MODES when they are a proper subset of it (no
    repeats), else None."""
    if modes == ALL_MODES or len(set(modes)) != len(modes) or not set(modes) <= set(ALL_MODES):
        return None
    return [ALL_MODES.index(r) for r in modes]


def _table(problem, v: Variant, modes: tuple[str, ...]) -> LayerTable:
    idx = subset_of_all(modes)
    if idx is None:
        return _build(problem, v, modes)
    return mode_columns(layer_table(problem, v, ALL_MODES), modes)


def mode_columns(lt: LayerTable, modes: tuple[str, ...]) -> LayerTable:
    """The table of `modes` (a subset of lt.modes) from lt: its per-mode columns taken, the rest
    shared. Every per-mode array of `_build` is computed column by column (elementwise, and
    cumulative sums and maxima along the layer axis), so these are the floats `_build` would
    give for `modes` (tests/test_speed_exact.py)."""
    idx = [lt.modes.index(r) for r in modes]

    def col(x):
        return read_only(x[..., idx])

    return replace(lt, modes=modes, rec_LR=col(lt.rec_LR), act_LR=col(lt.act_LR),
                   work_LR=col(lt.work_LR), comp_LLR=col(lt.comp_LLR), act_LLR=col(lt.act_LLR),
                   work_LLR=col(lt.work_LLR),
                   cum=read_only({**lt.cum, "rec_LR": col(lt.cum["rec_LR"])}))


def _build(problem, v: Variant, modes: tuple[str, ...]) -> LayerTable:
    g = problem.graph
    if not problem.has_variant(v):
        raise KeyError(f"the problem's layer graph has no variant {v.key}: "
                       f"use problem.with_variants([...]) first")
    costs = tuple(la.costs[v.key] for la in g.layers)
    times = problem.cache.get("layer_times", v, lambda: _times(problem, costs, v))
    L = g.num_layers
    fwd_L, bwd_L = np.array([t.fwd_s for t in times]), np.array([t.bwd_s for t in times])
    rec_LR = np.array([[t.recompute_s[r] for r in modes] for t in times])
    # selective module recomputation frees saved tensors (nest.costs.table.module_freed_bytes)
    mods = problem.costs.recompute_modules
    freed_L = np.array([module_freed_bytes(mods, c, v, g.fp8_activations) if mods else 0.0
                        for c in costs])
    freed_LR = freed_L[:, None] * np.array([r in FREED_MODES for r in modes])
    act_LR = np.array([[c.act_bytes[r] for r in modes] for c in costs]) - freed_LR
    dense_L = np.array([c.dense_params for c in costs])
    expert_L = np.array([c.expert_params for c in costs])
    tied = tied_embedding_params(problem.model, g, v.tp)
    pd_LL = range_sum(dense_L)
    pd_LL[L - 1, 0] -= tied  # one stage holding embedding and head keeps one copy
    comp_LR = (fwd_L + bwd_L)[:, None] + rec_LR
    # Transformer Engine runs the blocks' linear layers in FP8 (nest.spec.precision.FP8_GEMMS); the
    # embedding and the LM head stay BF16. A block's norm and router weights (2h + h E) are
    # counted with them: < 0.1% of a block.
    fp8_L = np.array([(c.dense_params + c.expert_params) * (la.kind == "block")
                      for c, la in zip(costs, g.layers)])
    none_L = np.array([c.act_bytes["none"] for c in costs]) - freed_L
    work_LR = none_L[:, None] - act_LR
    return LayerTable(
        v, modes, read_only(fwd_L), read_only(bwd_L), read_only(rec_LR), read_only(act_LR),
        read_only(work_LR),
        read_only(dense_L), read_only(expert_L),
        read_only(np.array([c.output_bytes for c in costs])), costs, tied,
        pd_LL=read_only(pd_LL), pe_LL=read_only(range_sum(expert_L)),
        comp_LLR=read_only(range_sum(comp_LR)), act_LLR=read_only(range_sum(act_LR)),
        work_LLR=read_only(range_max(work_LR)), maxpar_LL=read_only(range_max(dense_L + expert_L)),
        fp8_LL=read_only(range_sum(fp8_L)),
        gemm_fwd_L=read_only(np.array([t.gemm_fwd_s for t in times])),
        gemm_bwd_L=read_only(np.array([t.gemm_bwd_s for t in times])),
        proj_fwd_L=read_only(np.array([t.proj_fwd_s for t in times])),
        down_fwd_L=read_only(np.array([t.down_fwd_s for t in times])),
        col_bwd_L=read_only(np.array([t.col_bwd_s for t in times])),
        cum=read_only({"fwd_L": prefix(fwd_L), "bwd_L": prefix(bwd_L), "rec_LR": prefix(rec_LR)}))


def _times(problem, costs, v: Variant) -> tuple[LayerTimes, ...]:
    """Each layer's times; kept per variant in the problem's cache apart from the tables (one
    per variant and modes), which need them again for every set of modes."""
    priced: dict[int, LayerTimes] = {}  # identical blocks share one cost object: priced once
    for c in costs:
        if id(c) not in priced:
            priced[id(c)] = problem.costs.times_of(c, v)
    return tuple(priced[id(c)] for c in costs)


def prefix(x_L: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros((1,) + x_L.shape[1:]), np.cumsum(x_L, axis=0)])


def range_sum(x_L: np.ndarray) -> np.ndarray:
    """S[b, a] = sum x[a..b] (valid for a <= b)."""
    c = prefix(x_L)
    return c[1:, None] - c[None, :-1]


def range_max(x_L: np.ndarray) -> np.ndarray:
    """M[b, a] = max x[a..b] (valid for a <= b); x may carry trailing axes."""
    n = x_L.shape[0]
    tail = (1,) * (x_L.ndim - 1)
    b_ge_a = np.tri(n, dtype=bool).reshape((n, n) + tail)  # [b, a]
    # column a: x[b] for b >= a, -inf above (never the max of a non-empty range), then the
    # running max down each column: max x[a..b], the same floats as accumulating from each a
    run = np.maximum.accumulate(np.where(b_ge_a, x_L[:, None], -np.inf), axis=0)
    return np.where(b_ge_a, run, 0.0)  # a > b cells are masked later; values >= 0

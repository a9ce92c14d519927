"""Layer graph x variant -> per-layer vectors and [last, first] range tables of a stage's layers.

Part of the stage kernel (nest.costs.stage): compute per layer (fwd, bwd, recomputed fwd per mode,
nest.costs.table), saved activations and working sets, dense / expert parameters (the tied
embedding counted once on a stage holding both ends: nest.costs.memory.tied_embedding_params),
boundary bytes, and their range sums / maxima over every stage a..b, indexed [b, a].
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from nest.costs.memory import tied_embedding_params
from nest.graph.layer_graph import Variant


@dataclass
class LayerTable:
    """Per-layer vectors of one variant and their range tables over every stage a..b."""

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
    costs: list  # LayerCost per layer
    tied: float  # tied embedding parameters per device (nest.costs.memory)
    # [b, a] range tables: sums (maxima for work / maxpar) over layers a..b
    pd_LL: np.ndarray = None
    pe_LL: np.ndarray = None
    comp_LLR: np.ndarray = None
    act_LLR: np.ndarray = None
    work_LLR: np.ndarray = None
    maxpar_LL: np.ndarray = None
    fp8_LL: np.ndarray = None  # parameters of the stage's FP8 GEMMs (its blocks; nest.precision)
    gemm_fwd_L: np.ndarray = None  # the GEMMs' part of fwd_L / bwd_L (tensor-parallel overlap)
    gemm_bwd_L: np.ndarray = None
    cum: dict = field(default_factory=dict)  # prefix sums for one-cell breakdowns
    group_cache: OrderedDict = field(default_factory=OrderedDict)

    @property
    def num_layers(self) -> int:
        return len(self.dense_L)

    @property
    def comp_LR(self) -> np.ndarray:
        return (self.fwd_L + self.bwd_L)[:, None] + self.rec_LR


def layer_table(problem, v: Variant, modes: tuple[str, ...]) -> LayerTable:
    """The variant's table (cached on the problem; the problem must hold the variant)."""
    key = ("layer_table", v, tuple(modes))
    cache = problem.cache
    if key in cache:
        return cache[key]
    g = problem.graph
    if not problem.has_variant(v):
        raise KeyError(f"the problem's layer graph has no variant {v.key}: "
                       f"use problem.with_variants([...]) first")
    costs = [la.costs[v.key] for la in g.layers]
    times = [problem.costs.times(i, v.key) for i in range(g.num_layers)]
    lt = LayerTable(
        v, tuple(modes), np.array([t.fwd_s for t in times]), np.array([t.bwd_s for t in times]),
        np.array([[t.recompute_s[r] for r in modes] for t in times]),
        np.array([[c.act_bytes[r] for r in modes] for c in costs]),
        np.array([[c.act_bytes["none"] - c.act_bytes[r] for r in modes] for c in costs]),
        np.array([c.dense_params for c in costs]), np.array([c.expert_params for c in costs]),
        np.array([c.output_bytes for c in costs]), costs,
        tied_embedding_params(problem.model, g, v.tp))
    L = g.num_layers
    lt.pd_LL = range_sum(lt.dense_L)
    lt.pd_LL[L - 1, 0] -= lt.tied  # one stage holding embedding and head keeps one copy
    lt.pe_LL = range_sum(lt.expert_L)
    lt.comp_LLR = range_sum(lt.comp_LR)
    lt.act_LLR = range_sum(lt.act_LR)
    lt.work_LLR = range_max(lt.work_LR)
    lt.maxpar_LL = range_max(lt.dense_L + lt.expert_L)
    # Transformer Engine runs the blocks' linear layers in FP8 (nest.precision.FP8_GEMMS); the
    # embedding and the LM head stay BF16. A block's norm and router weights (2h + h E) are
    # counted with them: < 0.1% of a block.
    lt.fp8_LL = range_sum(np.array([(c.dense_params + c.expert_params) * (la.kind == "block")
                                    for c, la in zip(costs, g.layers)]))
    lt.gemm_fwd_L = np.array([t.gemm_fwd_s for t in times])
    lt.gemm_bwd_L = np.array([t.gemm_bwd_s for t in times])
    for name in ("fwd_L", "bwd_L", "rec_LR"):
        lt.cum[name] = prefix(getattr(lt, name))
    cache[key] = lt
    return lt


def prefix(x_L: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros((1,) + x_L.shape[1:]), np.cumsum(x_L, axis=0)])


def range_sum(x_L: np.ndarray) -> np.ndarray:
    """S[b, a] = sum x[a..b] (valid for a <= b)."""
    c = prefix(x_L)
    return c[1:, None] - c[None, :-1]


def range_max(x_L: np.ndarray) -> np.ndarray:
    """M[b, a] = max x[a..b] (valid for a <= b); x may carry trailing axes."""
    n = x_L.shape[0]
    out = np.zeros((n, n) + x_L.shape[1:])  # a > b cells are masked later; values >= 0
    for a in range(n):
        out[a:, a] = np.maximum.accumulate(x_L[a:], axis=0)
    return out

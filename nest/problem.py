"""Model x cluster x training -> a frozen Problem: what every planner and the evaluator read.

A Problem never changes once built: its layer graph holds every sub-graph variant it was built
with, and a plan or a space that needs another variant gets a *new* problem
(`with_variants`), so one planner can never change the space the next one searches.
`with_mbs`, `with_cluster`, `with_hardware` and `with_training` likewise return new problems.
Layer graphs come from nest.graph.build_graph's per-process cache and are shared, never mutated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from nest.costs.table import CostTable
from nest.errors import PlanError
from nest.graph import build_graph
from nest.graph.attention import resolve as resolve_attention
from nest.graph.attention import with_attention
from nest.graph.fp8 import with_fp8_activations
from nest.graph.layer_graph import LayerGraph, Variant
from nest.settings import TrainingSettings, load_training
from nest.specs import ClusterSpec, HardwareSpec, ModelSpec, load_cluster, load_model


@dataclass(frozen=True, eq=False)
class Problem:
    """Everything a planner and the evaluator need: model, cluster, graph, costs, training."""

    model: ModelSpec
    cluster: ClusterSpec
    graph: LayerGraph
    costs: CostTable
    training: TrainingSettings
    model_ref: str = ""  # how the plan names the model (catalog name or path)
    cluster_ref: str = ""
    # derived tables of this problem (nest.costs.layers.layer_table); a new problem starts empty
    cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # the layer graph as built (attention "described"); `graph` is it as the training settings'
    # attention implementation runs it (nest.graph.attention), set by __post_init__
    described: LayerGraph | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        from nest.precision import check

        check(self.training.precision, f"training settings for {self.cluster.hardware.name}",
              self.training.optimizer, self.cluster.hardware)
        self._view_attention()
        self._apply_cost_scale()

    def _apply_cost_scale(self) -> None:
        """The training settings' cost_scale (nest.settings.CostScale) on the cost table and the
        cluster, whatever built this problem: every planner and the evaluator price through
        these two, so each re-plans under the perturbed model (a no-op at 1.0 / 1.0)."""
        cs = self.training.cost_scale
        if self.costs.scale != cs.compute:
            object.__setattr__(self, "costs", CostTable(self.graph, self.costs.hw,
                                                        self.costs.profile, self.costs.compute,
                                                        cs.compute))
        if self.cluster.comm_scale != cs.communication:
            object.__setattr__(self, "cluster", self.cluster.with_comm_scale(cs.communication))

    def _view_attention(self) -> None:
        """`graph` := the described graph viewed with this problem's attention implementation
        and, under FP8 compute, FP8 saved GEMM inputs (nest.graph.fp8); a new cost table when
        the view changes, the same objects otherwise."""
        raw = self.graph if self.graph.attention == "described" else self.described
        impl = resolve_attention(self.training.attention, self.cluster.hardware)
        if raw is None:  # a graph given already viewed, without its description
            if self.graph.attention != impl:
                raise ValueError(f"layer graph of {self.graph.model} is viewed with "
                                 f"{self.graph.attention} attention, the settings ask {impl}")
            return
        g = with_attention(raw, impl, self.model.has_dropout)
        if self.training.precision.fp8:  # Transformer Engine keeps FP8 GEMM inputs
            g = with_fp8_activations(g)
        object.__setattr__(self, "described", raw)
        if g is not self.graph:
            object.__setattr__(self, "graph", g)
            object.__setattr__(self, "costs", CostTable(g, self.costs.hw, self.costs.profile,
                                                        self.costs.compute, self.costs.scale))

    @property
    def attention(self) -> str:
        """The attention implementation this problem prices (nest.graph.attention)."""
        return self.graph.attention

    @property
    def compute(self) -> str:
        """The compute dtype the cost table prices (nest.precision)."""
        return self.training.precision.compute

    @property
    def mbs(self) -> int:
        return self.graph.mbs

    @property
    def num_devices(self) -> int:
        return self.cluster.num_devices

    @property
    def hardware(self) -> HardwareSpec:
        return self.cluster.hardware

    def num_microbatches(self, dp: int, ep: int) -> int:
        """Micro-batches per pipeline; the ep ranks of a stage run distinct micro-batches."""
        return math.ceil(self.training.global_batch / (self.mbs * dp * ep))

    def has_variant(self, v: Variant) -> bool:
        return v.key in self.graph.layers[0].costs

    # -- new problems ---------------------------------------------------------------------------
    def with_variants(self, variants, where: str = "") -> "Problem":
        """This problem with the layer graph extended by `variants` (self if it has them all)."""
        missing = [v for v in dict.fromkeys(variants) if not self.has_variant(v)]
        if not missing:
            return self
        m = self.model
        where = where or f"plan for {m.name}"
        for v in missing:
            check_variant(m, v, where)
        try:
            if self.graph.source == "torch_fx":
                from nest.graph.fx_extract import build_layer_graph_fx

                extra = build_layer_graph_fx(m, self.mbs, missing)
            else:
                from nest.graph.closed_form import build_layer_graph

                extra = build_layer_graph(m, self.mbs, missing)
        except ValueError as e:  # a variant the model's modules cannot be split into
            keys = ", ".join(v.key for v in missing)
            raise PlanError(f"{where}: variant {keys}: {e}") from None
        raw = self.described
        if raw is None:  # built from an already viewed graph: nothing to extend consistently
            raise ValueError(f"{where}: the problem's layer graph has no described form to "
                             f"extend with variants {[v.key for v in missing]}")
        layers = [replace(la, costs={**la.costs, **{v.key: new.costs[v.key] for v in missing}})
                  for la, new in zip(raw.layers, extra.layers)]
        g = replace(raw, layers=layers, variants=[*raw.variants, *missing])
        return replace(self, graph=g, costs=CostTable(g, self.cluster.hardware,
                                                      self.costs.profile, self.compute))

    def with_mbs(self, mbs: int) -> "Problem":
        """The same problem for another micro-batch size (its own layer graph and cost table),
        with the variants this one has."""
        if mbs == self.mbs:
            return self
        g = build_graph(self.model, mbs, self.training.graph_source)
        out = replace(self, graph=g, described=None, costs=CostTable(g, self.cluster.hardware,
                                                     self.costs.profile, self.compute))
        return out.with_variants(self.graph.variants)

    def with_cluster(self, cluster: ClusterSpec) -> "Problem":
        costs = self.costs
        if cluster.hardware != self.cluster.hardware:
            costs = CostTable(self.graph, cluster.hardware, compute=self.compute)
        return replace(self, cluster=cluster, costs=costs)

    def with_hardware(self, **kw) -> "Problem":
        """Hardware fields replaced, e.g. with_hardware(hbm_bytes=4e9)."""
        return self.with_cluster(replace(self.cluster, hardware=replace(self.cluster.hardware,
                                                                        **kw)))

    def with_training(self, training: TrainingSettings | None = None, **kw) -> "Problem":
        tr = (training or self.training).with_(**kw) if kw else (training or self.training)
        if tr.precision.compute != self.compute:  # FP8 GEMMs are priced differently
            return replace(self, training=tr, costs=CostTable(self.graph, self.cluster.hardware,
                                                              self.costs.profile,
                                                              tr.precision.compute))
        return replace(self, training=tr)

    def with_graph(self, graph: LayerGraph, model: ModelSpec | None = None) -> "Problem":
        """Another layer graph, as built (its attention described)."""
        return replace(self, model=model or self.model, graph=graph, described=None,
                       costs=CostTable(graph, self.cluster.hardware, compute=self.compute))


def check_variant(m: ModelSpec, v: Variant, where: str) -> None:
    """A PlanError naming the key when the model cannot be split into variant v."""
    if m.num_heads % v.tp or m.num_kv_heads % v.tp and v.tp % m.num_kv_heads:
        raise PlanError(f"{where}: key 'tp': {v.tp} must divide num_heads={m.num_heads} "
                        f"and divide or be a multiple of num_kv_heads={m.num_kv_heads}")
    if m.num_experts % v.ep:
        raise PlanError(f"{where}: key 'ep': {v.ep} must divide num_experts={m.num_experts}")
    if m.seq_len % v.cp:
        raise PlanError(f"{where}: key 'cp': {v.cp} must divide seq_len={m.seq_len}")
    if v.sp and v.tp == 1:
        raise PlanError(f"{where}: key 'sp': sequence parallelism needs tp > 1")


def with_mbs(problem: Problem, mbs: int) -> Problem:
    return problem.with_mbs(mbs)


def make_problem(model: str, cluster: str, num_devices: int | None = None, mbs: int = 1,
                 training: TrainingSettings | None = None,
                 graph: LayerGraph | None = None, variants=(),
                 seq_len: int | None = None) -> Problem:
    """seq_len replaces the model's sequence length (a config.json has none of its own); with a
    prebuilt `graph` it defaults to the graph's, so the model and its graph agree."""
    if seq_len is None and graph is not None:
        seq_len = graph.seq_len
    m = load_model(model, seq_len=seq_len)
    c = load_cluster(cluster, num_devices)
    tr = training or load_training()
    g = graph or build_graph(m, mbs, tr.graph_source)
    pr = Problem(m, c, g, CostTable(g, c.hardware, compute=tr.precision.compute), tr, str(model),
                 str(cluster))
    return pr.with_variants(variants) if variants else pr

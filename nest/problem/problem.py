"""Model x cluster x training -> a frozen Problem: what every planner and the evaluator read.

A Problem never changes once built: its layer graph holds every sub-graph variant it was built
with, and a plan or a space that needs another variant gets a *new* problem
(`with_variants`), so one planner can never change the space the next one searches.
`with_mbs`, `with_cluster`, `with_hardware` and `with_training` likewise return new problems.
Layer graphs come from nest.graph.build_graph's per-process cache and are shared: they are frozen
(nest.graph.layer_graph), so no problem can change one. What a problem derives (layer tables,
group terms, stage grids) lives in its own nest.costs.cache.ProblemCache, shared with no other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from nest.costs.cache import ProblemCache
from nest.costs.table import AUTO, CostTable
from nest.common.errors import PlanError
from nest.graph import build_graph
from nest.graph.attention import resolve as resolve_attention
from nest.graph.attention import with_attention
from nest.graph.fp8 import with_fp8_activations
from nest.graph.layer_graph import LayerGraph, Variant
from nest.spec.settings import TrainingSettings, load_training
from nest.spec.catalog import ClusterSpec, HardwareSpec, ModelSpec, load_cluster, load_model


@dataclass(frozen=True, eq=False)
class Problem:
    """Everything a planner and the evaluator need: model, cluster, graph, costs, training.

    Built whole by `Problem.build` (and the `with_*` methods, which call it): no field is set
    after construction. Constructing one directly checks that its fields agree (the graph viewed
    as the training settings run it, the cost table on that graph, the cost scale applied)."""

    model: ModelSpec
    cluster: ClusterSpec
    graph: LayerGraph  # as the training settings' attention implementation runs it
    costs: CostTable
    training: TrainingSettings
    model_ref: str = ""  # how the plan names the model (catalog name or path)
    cluster_ref: str = ""
    # the layer graph as built (attention "described"; nest.graph.attention); None when the
    # problem was given an already viewed graph
    described: LayerGraph | None = field(default=None, repr=False, compare=False)
    # the tables derived from this problem (nest.costs.cache); a new problem starts empty
    cache: ProblemCache = field(default_factory=ProblemCache, init=False, repr=False,
                                compare=False)

    def __post_init__(self):
        from nest.spec.precision import check

        check(self.training.precision, f"training settings for {self.cluster.hardware.name}",
              self.training.optimizer, self.cluster.hardware)
        cs, where = self.training.cost_scale, f"problem for {self.model.name}"
        impl = resolve_attention(self.training.attention, self.cluster.hardware)
        if self.graph.attention != impl:
            raise ValueError(f"{where}: layer graph of {self.graph.model} is viewed with "
                             f"{self.graph.attention} attention, the settings ask {impl}")
        if self.described is not None and self.described.attention != "described":
            raise ValueError(f"{where}: `described` must be the layer graph as built")
        if (self.costs.graph is not self.graph or self.costs.hw != self.cluster.hardware
                or any(getattr(self.costs, k) != x
                       for k, x in cost_settings(self.model, self.training).items())
                or self.cluster.comm_scale != cs.communication):
            raise ValueError(f"{where}: cost table, cluster and training settings disagree: "
                             f"build problems with Problem.build")

    @classmethod
    def build(cls, model: ModelSpec, cluster: ClusterSpec, graph: LayerGraph,
              training: TrainingSettings, model_ref: str = "", cluster_ref: str = "", *,
              profile=AUTO, described: LayerGraph | None = None) -> "Problem":
        """The problem of `graph` (as built, or already viewed with `described` its built form)
        under `training`: the graph viewed with the settings' attention implementation and,
        under FP8 compute, FP8 saved GEMM inputs (nest.graph.fp8); the training settings'
        cost_scale (nest.spec.settings.CostScale) on the cost table and the cluster, so every
        planner and the evaluator price the perturbed model (a no-op at 1.0 / 1.0).
        profile: the cost table's (nest.costs.table.CostTable)."""
        raw = graph if graph.attention == "described" else described
        impl = resolve_attention(training.attention, cluster.hardware)
        if raw is None:  # a graph given already viewed, without its description
            if graph.attention != impl:
                raise ValueError(f"layer graph of {graph.model} is viewed with "
                                 f"{graph.attention} attention, the settings ask {impl}")
            g = graph
        else:
            g = with_attention(raw, impl, model.has_dropout)
            if training.precision.fp8:  # Transformer Engine keeps FP8 GEMM inputs
                g = with_fp8_activations(g)
        cs = training.cost_scale
        if cluster.comm_scale != cs.communication:
            cluster = cluster.with_comm_scale(cs.communication)
        costs = CostTable(g, cluster.hardware, profile, **cost_settings(model, training))
        return cls(model, cluster, g, costs, training, model_ref, cluster_ref, raw)

    def _rebuild(self, **changes) -> "Problem":
        """This problem with fields changed, built whole again (`build`); the cost table keeps
        this one's profile unless the hardware changes."""
        kw = {"model": self.model, "cluster": self.cluster, "training": self.training,
              "model_ref": self.model_ref, "cluster_ref": self.cluster_ref,
              "graph": self.graph, "described": self.described, "profile": self.costs.profile}
        kw.update(changes)
        if kw["cluster"].hardware != self.cluster.hardware and "profile" not in changes:
            kw["profile"] = AUTO
        return Problem.build(**kw)

    @property
    def attention(self) -> str:
        """The attention implementation this problem prices (nest.graph.attention)."""
        return self.graph.attention

    @property
    def compute(self) -> str:
        """The compute dtype the cost table prices (nest.spec.precision)."""
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
        return self._rebuild(graph=g, described=None)

    def with_mbs(self, mbs: int) -> "Problem":
        """The same problem for another micro-batch size (its own layer graph and cost table),
        with the variants this one has; the same object for the same size (problems are frozen).
        """
        if mbs == self.mbs:
            return self

        def make():
            g = build_graph(self.model, mbs, self.training.graph_source,
                            declared_subset(self.model, self.graph.variants))
            return self._rebuild(graph=g, described=None).with_variants(self.graph.variants)

        # one problem per size, kept in this one's cache: the searches, the evaluation of the
        # plan and the all-devices search (nest.interfaces.cli_run) share its derived tables
        return self.cache.get("with_mbs", mbs, make)

    def with_cluster(self, cluster: ClusterSpec) -> "Problem":
        """Another cluster (the training settings' communication scale applied to it)."""
        return self._rebuild(cluster=cluster)

    def with_hardware(self, **kw) -> "Problem":
        """Hardware fields replaced, e.g. with_hardware(hbm_bytes=4e9)."""
        return self.with_cluster(replace(self.cluster, hardware=replace(self.cluster.hardware,
                                                                        **kw)))

    def with_profile(self, profile) -> "Problem":
        """This problem priced from another operator profile (a nest.costs.profiled.ProfileSet,
        e.g. `for_attention_kernel`'s, or None: the roofline)."""
        return self._rebuild(profile=profile)

    def with_training(self, training: TrainingSettings | None = None, **kw) -> "Problem":
        tr = (training or self.training).with_(**kw) if kw else (training or self.training)
        return self._rebuild(training=tr)

    def with_graph(self, graph: LayerGraph, model: ModelSpec | None = None) -> "Problem":
        """Another layer graph, as built (its attention described)."""
        return self._rebuild(model=model or self.model, graph=graph, described=None,
                             profile=AUTO)


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


def cost_settings(model: ModelSpec, training: TrainingSettings) -> dict:
    """The cost table's settings (nest.costs.table.CostTable's keyword arguments, also its
    attributes) that the model and the training settings decide: the one place they are read,
    by `Problem.build` and by the check that a problem's table agrees with them."""
    return {"compute": training.precision.compute, "scale": training.cost_scale.compute,
            "dispatcher": training.moe_dispatcher,
            "moe_imbalance": training.moe_routing_imbalance,
            "moe_padded": training.moe_pad_to_capacity,
            "expert_bias": model.is_moe and model.linear_bias,
            "fp8_recipe": training.precision.fp8_recipe,
            "expert_clamp": model.is_moe and model.glu_clamp > 0,
            "rope_unfused": not training.rope_fusion,
            "recompute_modules": tuple(training.recompute_modules)}


def declared_subset(model: ModelSpec, variants) -> tuple[Variant, ...] | None:
    """The model's declared variants that are among `variants`, in declared order; None when
    that is all of them (build_graph's whole graph, so problems share it)."""
    from nest.graph.closed_form import variants_of

    declared = variants_of(model)
    keep = set(variants)
    subset = tuple(v for v in declared if v in keep)
    return None if len(subset) == len(declared) else subset


def launchable_variants(model: ModelSpec) -> tuple[Variant, ...] | None:
    """`declared_subset` of the model's launchable variants (Variant.launchable): the graph
    `nest plan` builds for its default space."""
    from nest.graph.closed_form import variants_of

    return declared_subset(model, [v for v in variants_of(model) if v.launchable])


def make_problem(model: str, cluster: str, num_devices: int | None = None, mbs: int = 1,
                 training: TrainingSettings | None = None,
                 graph: LayerGraph | None = None, variants=(),
                 seq_len: int | None = None, launchable_only: bool = False) -> Problem:
    """seq_len replaces the model's sequence length (a config.json has none of its own); with a
    prebuilt `graph` it defaults to the graph's, so the model and its graph agree.
    launchable_only: the graph of the model's launchable variants only (Variant.launchable:
    `nest plan`'s default space searches no other, so their traces are all it needs)."""
    if seq_len is None and graph is not None:
        seq_len = graph.seq_len
    m = load_model(model, seq_len=seq_len)
    c = load_cluster(cluster, num_devices)
    tr = training or load_training()
    if graph is None and launchable_only:
        graph = build_graph(m, mbs, tr.graph_source, launchable_variants(m))
    g = graph or build_graph(m, mbs, tr.graph_source)
    pr = Problem.build(m, c, g, tr, str(model), str(cluster))
    return pr.with_variants(variants) if variants else pr

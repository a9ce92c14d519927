"""The layer-graph contract (`nest.layer_graph/v1`): layers x sub-graph variants -> per-device costs.

A layer graph is built for one model and one micro-batch size. Each layer (embedding, every
transformer block, final norm + LM head + loss) carries, for every sub-graph parallel variant
(tp, sp, ep, cp), what ONE device of a stage replica does per micro-batch: its operators (FLOPs
and HBM bytes, forward and backward), the parameters it stores, the activation bytes it saves for
backward under each recomputation mode, the boundary activation it sends to the next stage, and
the collectives the variant inserts (kind, bytes, group). All values are SI (FLOPs, bytes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType

from nest.spec.catalog import validate

SCHEMA = "nest.layer_graph/v1"
RECOMPUTE_MODES = ("none", "selective", "full")
# the row-parallel GEMMs of a block (Megatron-LM's RowParallelLinear: attention out-projection,
# MLP down projection), whose forward output is reduced (reduce-scattered under sequence
# parallelism) over tp, and the column-parallel ones (ColumnParallelLinear: QKV, MLP up /
# gate-up), whose input is all-gathered over tp under sequence parallelism; op names of the graph
ROW_PARALLEL = ("out_proj", "mlp_down")
COLUMN_PARALLEL = ("qkv", "mlp_up", "mlp_gate_up")


@dataclass(frozen=True)
class Variant:
    """A sub-graph parallel variant; devices per stage replica = tp * ep * cp."""

    tp: int = 1
    sp: bool = False
    ep: int = 1
    cp: int = 1

    @property
    def key(self) -> str:
        return f"tp{self.tp}_sp{int(self.sp)}_ep{self.ep}_cp{self.cp}"

    @property
    def width(self) -> int:
        return self.tp * self.ep * self.cp

    @property
    def launchable(self) -> bool:
        """Whether Megatron-LM runs the groups this variant prices: not cp > 1 with ep > 1
        (Megatron-LM builds its expert groups on a grid that folds ep over the cp ranks;
        nest.interfaces.export projects such a plan). `nest plan`'s default space holds only
        these (nest.solver.launchable.launchable_space), and so does the layer graph it builds."""
        return self.cp == 1 or self.ep == 1

    @staticmethod
    def from_key(key: str) -> "Variant":
        parts = dict((p[:2], p[2:]) for p in key.split("_"))
        return Variant(int(parts["tp"]), bool(int(parts["sp"])), int(parts["ep"]), int(parts["cp"]))


@dataclass(frozen=True)
class Op:
    """One operator on one device per micro-batch. kind: matmul | attention | memory."""

    name: str
    kind: str
    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float
    shape: tuple[int, ...] = ()  # (m, n, k) for matmul; (b, heads, s_q, s_kv, head_dim) attention
    count: int = 1  # identical instances (e.g. local experts)


@dataclass(frozen=True)
class Collective:
    """A collective the variant inserts. group: tp | ep | cp. phase: fwd | bwd."""

    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all
    phase: str
    group: str
    bytes: float  # buffer size (the full, gathered tensor for all_gather / reduce_scatter)
    count: int = 1


def read_only(d) -> MappingProxyType:
    """A read-only copy of a mapping (what a frozen graph holds instead of a dict)."""
    return d if isinstance(d, MappingProxyType) else MappingProxyType(dict(d))


def _hold(obj, **fields) -> None:
    """Frozen-dataclass input normalisation, at construction only: each container field stored
    as its read-only form (a list as a tuple, a dict as a read-only mapping) with the same items,
    so nothing reachable from a layer graph can be written."""
    for name, value in fields.items():
        object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class LayerCost:
    ops: tuple[Op, ...]
    collectives: tuple[Collective, ...]
    dense_params: float  # per device, replicated over the data-parallel group d * ep * cp
    expert_params: float  # per device, replicated over the expert-data-parallel group d * cp
    act_bytes: Mapping[str, float]  # recompute mode -> bytes saved for backward per micro-batch
    recompute_ops: Mapping[str, tuple[str, ...]]  # recompute mode -> names of ops re-run
    output_bytes: float  # boundary activation sent to the next stage per micro-batch

    def __post_init__(self):
        _hold(self, ops=tuple(self.ops), collectives=tuple(self.collectives),
              act_bytes=read_only(self.act_bytes),
              recompute_ops=read_only({k: tuple(v) for k, v in self.recompute_ops.items()}))

    @property
    def params(self) -> float:
        return self.dense_params + self.expert_params

    @property
    def fwd_flops(self) -> float:
        return sum(o.fwd_flops * o.count for o in self.ops)

    @property
    def bwd_flops(self) -> float:
        return sum(o.bwd_flops * o.count for o in self.ops)


@dataclass(frozen=True)
class Layer:
    index: int
    name: str
    kind: str  # embedding | block | head
    num_params: float  # unsharded, counted once for the whole model
    costs: Mapping[str, LayerCost] = field(default_factory=dict)  # variant key -> cost

    def __post_init__(self):
        _hold(self, costs=read_only(self.costs))


@dataclass(frozen=True, eq=False)
class LayerGraph:
    """Frozen all the way down (tuples, read-only mappings, frozen dataclasses): a graph shared
    by every problem built on it (nest.graph.build_graph's cache) cannot be changed through
    any of them. Compared by identity; compare `to_dict()` for content."""

    model: str
    mbs: int
    seq_len: int
    hidden_size: int
    tied_embeddings: bool
    variants: tuple[Variant, ...]
    layers: tuple[Layer, ...]
    source: str = "closed_form"
    # "described": as built (nest.graph.attention); "flash" | "unfused" once viewed as a run
    # implements attention (nest.graph.attention.with_attention; not serialised)
    attention: str = "described"
    # model FLOPs per sample {causal half, full square}, kept from the described graph by a view
    model_flops: dict | None = None
    fp8_activations: bool = False  # saved GEMM inputs in FP8 (nest.graph.fp8; not serialised)

    def __post_init__(self):
        _hold(self, variants=tuple(self.variants), layers=tuple(self.layers),
              model_flops=None if self.model_flops is None else read_only(self.model_flops))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def num_params(self) -> float:
        return sum(layer.num_params for layer in self.layers)

    def model_flops_per_sample(self, full_attention: bool = False) -> float:
        """Forward+backward model FLOPs of one sequence without parallelism or recomputation.
        The convention (README, "FLOPs and MFU"): causal attention counted as half the score
        square, as the graph describes it; full_attention=True counts the whole square, as
        Korthikanti et al.'s 72 B s l h^2 (1 + s / 6h + V / 12 l h) and NeMo 24.07 do."""
        if self.model_flops is not None:
            return self.model_flops[full_attention]
        if self.attention != "described":
            raise ValueError(f"layer graph of {self.model}: model FLOPs need the unsplit "
                             f"variant {Variant().key} in the described graph")
        v = Variant().key
        total = sum(la.costs[v].fwd_flops + la.costs[v].bwd_flops for la in self.layers)
        if full_attention:
            for la in self.layers:
                for o in la.costs[v].ops:
                    if o.kind == "attention":
                        b, heads, s_q, s_kv, d = o.shape
                        total += o.count * (3 * 4.0 * b * heads * s_q * s_kv * d
                                            - o.fwd_flops - o.bwd_flops)
        return total / self.mbs

    # ---- JSON contract ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "model": self.model,
            "mbs": self.mbs,
            "seq_len": self.seq_len,
            "hidden_size": self.hidden_size,
            "tied_embeddings": self.tied_embeddings,
            "source": self.source,
            "variants": [v.key for v in self.variants],
            "layers": [
                {
                    "index": la.index,
                    "name": la.name,
                    "kind": la.kind,
                    "num_params": la.num_params,
                    "costs": {k: _cost_to_dict(c) for k, c in la.costs.items()},
                }
                for la in self.layers
            ],
        }

    def write(self, path: str | Path) -> None:
        d = self.to_dict()
        validate(d, "layer_graph", str(path))
        from nest.common.atomic_io import write_text_atomic

        write_text_atomic(path, json.dumps(d, indent=1, sort_keys=True) + "\n")

    @staticmethod
    def from_dict(d: dict, where: str = "<layer graph>") -> "LayerGraph":
        validate(d, "layer_graph", where)
        shared: dict[str, LayerCost] = {}  # identical blocks share one cost object (and cache)

        def cost(c: dict) -> LayerCost:
            key = json.dumps(c, sort_keys=True)
            if key not in shared:
                shared[key] = _cost_from_dict(c)
            return shared[key]

        layers = [
            Layer(
                index=la["index"],
                name=la["name"],
                kind=la["kind"],
                num_params=la["num_params"],
                costs={k: cost(c) for k, c in la["costs"].items()},
            )
            for la in d["layers"]
        ]
        return LayerGraph(
            model=d["model"],
            mbs=d["mbs"],
            seq_len=d["seq_len"],
            hidden_size=d["hidden_size"],
            tied_embeddings=d["tied_embeddings"],
            variants=[Variant.from_key(k) for k in d["variants"]],
            layers=layers,
            source=d["source"],
        )

    @staticmethod
    def read(path: str | Path) -> "LayerGraph":
        return LayerGraph.from_dict(json.loads(Path(path).read_text()), str(path))


def _cost_to_dict(c: LayerCost) -> dict:
    return {"ops": [dict(asdict(o), shape=list(o.shape)) for o in c.ops],
            "collectives": [asdict(x) for x in c.collectives],
            "dense_params": c.dense_params, "expert_params": c.expert_params,
            "act_bytes": dict(c.act_bytes),
            "recompute_ops": {k: list(v) for k, v in c.recompute_ops.items()},
            "output_bytes": c.output_bytes}


def _cost_from_dict(d: dict) -> LayerCost:
    return LayerCost(
        ops=tuple(Op(**dict(o, shape=tuple(o["shape"]))) for o in d["ops"]),
        collectives=tuple(Collective(**c) for c in d["collectives"]),
        dense_params=d["dense_params"],
        expert_params=d["expert_params"],
        act_bytes=dict(d["act_bytes"]),
        recompute_ops={k: tuple(v) for k, v in d["recompute_ops"].items()},
        output_bytes=d["output_bytes"],
    )

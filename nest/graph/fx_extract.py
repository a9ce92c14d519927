"""Model spec -> torch.fx graph of each layer's per-device module on the meta device -> measured
layer graph (the `nest.layer_graph/v1` contract, source "torch_fx").

Each layer module of `torch_models` (one device's share under a variant) is traced with
torch.fx (its operator modules are the leaves) and executed on meta tensors by an fx Interpreter
under a TorchDispatchMode, forward and backward; nothing is allocated, nothing downloaded.
Per fx node, measured:
* FLOPs: torch.utils.flop_counter's formulas per aten call (mm / addmm / bmm / baddbmm ...),
  forward, and backward by mapping each autograd node to the fx node that created it
  (torch._C._current_autograd_node). Causal attention is scaled by 0.5 (flash kernels skip
  masked blocks, FlashAttention-2 section 3.1), the same convention as closed_form.
* HBM bytes: per aten call the elements it reads and writes (broadcast dims once, gathers only
  the rows they touch, views and allocations free); an fx node is ONE fused kernel pair, so a
  tensor both produced and consumed only inside the node (either phase) is not counted.
* Saved-for-backward bytes per micro-batch: torch.autograd.graph.saved_tensors_hooks collect
  the distinct storages autograd keeps (parameters and buffers excluded; integer indices and
  fp32 norm statistics included). Selective recomputation (the attention core under
  torch.utils.checkpoint) keeps what the other nodes save and the core's inputs, read from the
  same pass (TRACE_SELECTIVE runs the checkpointed pass instead: the check); full recomputation
  checkpoints the whole block (only its input kept).
  A gathered tensor flagged keep_shard is kept as its shard and re-gathered in backward (that
  all-gather is recorded).
* Collectives: recorded by the modules' collective nodes during forward and backward.
Identical transformer blocks are traced once per variant and shared. Fewer traces, each derived
number exact (tests compare with traces): every micro-batch from one trace at a tagged batch
(nest.graph.fx_batch; an MoE whose slots per expert are rounded up with the slots at a tag of
their own, every padded micro-batch from it), tp and cp above 4 from degrees 2 and 4 (nest.graph.fx_split), ep above 4
from ep 2 and 4 (nest.graph.fx_ep); one fx graph per module structure (_graph).

Checked on a GPU (H200, torch 2.11): running the same block modules on CUDA, the growth of
torch.cuda.memory_allocated over a forward pass equals the meta-measured saved bytes exactly for
GPT-3 (t = 1, 8, 8 + sp), Llama-3-70B, Mixtral (ep 1; ep 4 + cp 2) and BERT-large (t = 4), in
all three recomputation modes; the only differences were allocator granularity (BERT t = 1: a
3 MiB buffer in a 4 MiB segment) and cuBLAS workspaces on the first matmul of the process.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import flop_registry

from nest.graph import fx_batch, fx_ep, fx_split, meta_cache
from nest.graph import torch_models as tm
from nest.graph.closed_form import variants_of
from nest.graph.layer_graph import Collective, Layer, LayerCost, LayerGraph, Op, Variant
from nest.spec.catalog import ModelSpec, ParallelVariants

EXTERNAL = "<external>"  # producer / consumer outside the traced layer
aten = torch.ops.aten
_ALIASES = {aten._unsafe_view.default, aten.alias.default, aten.lift_fresh.default}
_NO_WRITE = {aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
             aten.empty_strided.default}
_GATHER_ARGS = {aten.embedding.default: (0, 1), aten.index_select.default: (0, 2)}  # table, index
_PHASES = ("fwd", "bwd")


@dataclass(frozen=True)
class NodeCost:
    """Measured cost of one fx node (one device, one micro-batch)."""

    name: str
    opcode: str  # placeholder | call_module | call_function | call_method | output ...
    target: str
    kind: str  # matmul | attention | memory | comm | view
    fwd_flops: float
    bwd_flops: float
    fwd_bytes: float
    bwd_bytes: float
    out_bytes: float


@dataclass
class TracedLayer:
    kind: str
    variant: Variant
    module: torch.nn.Module  # the device's layer module (traced at the batch tag if derived)
    graph: fx.Graph  # its fx graph (shared by modules of the same structure)
    nodes: list[NodeCost]
    cost: LayerCost
    # per op of cost.ops: its node's totals (fwd/bwd FLOPs, fwd/bwd bytes) before the division
    # by op.count (what nest.graph.fx_ep scales across ep)
    op_totals: tuple[tuple[float, float, float, float], ...] = ()

    @property
    def graph_module(self) -> fx.GraphModule:
        return fx.GraphModule(self.module, self.graph)


# --------------------------------------------------------------------------------------------
# Tracing and measurement
# --------------------------------------------------------------------------------------------


class _Tracer(fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return hasattr(m, "op_kind") or super().is_leaf_module(m, qualname)


def _tensors(x) -> list[torch.Tensor]:
    """The tensors in x in tree_flatten's order (tuples, lists, dict values), without pytree's
    per-call overhead (a tenth of a trace); other containers go through tree_flatten."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    if type(x) is dict:
        return [t for item in x.values() for t in _tensors(item)]
    if x is None or isinstance(x, (int, float, bool, str, torch.dtype, torch.device)):
        return []
    return [t for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)]


def _touched(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a view addresses (a broadcast dimension counts once)."""
    if t.is_contiguous():  # no zero stride but on size-1 dimensions: every element
        return t.numel() * t.element_size()
    return math.prod(n for n, st in zip(t.shape, t.stride()) if st != 0) * t.element_size()


@dataclass
class _Event:
    node: str
    phase: str
    flops: float
    reads: list[tuple[int, int]]
    writes: list[tuple[int, int]]
    shapes: tuple = ()


class _Meter(TorchDispatchMode):
    """Attributes every aten call to the fx node running it (forward) or whose autograd node is
    running (backward): FLOPs from torch's flop formulas, storages read and written."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # nothing here is compiled: no per-call dynamo guard
        return False

    def __init__(self):
        super().__init__()
        self.node, self.phase = EXTERNAL, "fwd"
        self.owner: dict[int, str] = {}
        self.events: list[_Event] = []
        self._alive: list = []  # storage keys stay unique while their tensors live

    def claim(self, out, name: str) -> None:
        stack = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
        while stack:
            fn = stack.pop()
            if id(fn) in self.owner:
                continue
            self.owner[id(fn)] = name
            self._alive.append(fn)
            stack.extend(f for f, _ in fn.next_functions if f is not None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = meta_cache.call(func, args, kwargs)
        if func.is_view or func in _ALIASES:
            return out
        if self.phase == "fwd":
            node = self.node
        else:
            node = self.owner.get(id(torch._C._current_autograd_node()), EXTERNAL)
        formula = flop_registry.get(func._overloadpacket)
        flops = formula(*args, **kwargs, out_val=out) if formula else 0
        ins, outs = _tensors((args, kwargs)), _tensors(out)
        self._alive.append((ins, outs))
        if func in _NO_WRITE:  # an allocation reads and writes nothing
            reads = []
        elif func in _GATHER_ARGS:  # a gather reads its index and only the rows it returns
            ti, ii = _GATHER_ARGS[func]
            reads = [(tm.storage_key(args[ti]), sum(_touched(o) for o in outs)),
                     (tm.storage_key(args[ii]), _touched(args[ii]))]
        else:
            skip = args[0] if func is aten.copy_.default else None
            reads = [(tm.storage_key(t), _touched(t)) for t in ins if t is not skip]
        writes = [] if func in _NO_WRITE else [(tm.storage_key(t), _touched(t)) for t in outs]
        shapes = tuple(tuple(t.shape) for t in ins) if flops else ()
        self.events.append(_Event(node, self.phase, flops, reads, writes, shapes))
        return out


class _Saved:
    """saved_tensors_hooks: distinct storages kept for backward (and re-gathers on unpack)."""

    def __init__(self, exclude: set[int], meter: _Meter | None = None):
        self.exclude, self.bytes, self._regathered, self._alive = exclude, {}, set(), []
        self.meter = meter  # given: the fx nodes that saved each storage (forward)
        self.savers: dict[int, set[str]] = defaultdict(set)

    def pack(self, t):
        self._alive.append(t)
        k = tm.storage_key(t)
        if k not in self.exclude:
            log = tm._LOG
            if log is not None and k in log.regather:
                shard = log.regather[k][0]
                k = tm.storage_key(shard)
                self.bytes[k] = shard.untyped_storage().nbytes()
            else:
                self.bytes[k] = t.untyped_storage().nbytes()
            if self.meter is not None:
                self.savers[k].add(self.meter.node)
        return t

    def unpack(self, t):
        log = tm._LOG
        if log is not None:
            k = tm.storage_key(t)
            if k in log.regather and k not in self._regathered:
                self._regathered.add(k)
                log.add("all_gather", "bwd", log.regather[k][1], t.untyped_storage().nbytes())
        return t

    @property
    def total(self) -> float:
        return float(sum(self.bytes.values()))


class _Runner(fx.Interpreter):
    def __init__(self, module, meter: _Meter | None = None, selective: bool = False,
                 graph: fx.Graph | None = None):
        super().__init__(module, garbage_collect_values=False, graph=graph)
        self.meter, self.selective, self.values = meter, selective, {}

    def run_node(self, n):
        if self.meter is not None:
            self.meter.node = n.name
        out = super().run_node(n)
        if self.meter is not None:
            self.meter.claim(out, n.name)
            self.meter.node = EXTERNAL
        self.values[n.name] = out
        return out

    def call_module(self, target, args, kwargs):
        mod = self.fetch_attr(target)
        if self.selective and getattr(mod, "op_kind", None) == "attention":
            return checkpoint(mod, *args, use_reentrant=True, preserve_rng_state=False, **kwargs)
        return mod(*args, **kwargs)


def _excluded(module: torch.nn.Module) -> set[int]:
    return {tm.storage_key(t) for t in [*module.parameters(), *module.buffers()]}


def _node_bytes(events: list[_Event], out_keys: set[int],
                on_chip: set[str]) -> dict[tuple[str, str], list[int]]:
    """HBM bytes per (node, phase), as the integers they sum. A node is one fused kernel per
    phase: a storage it produces and only itself reads in the same phase stays on chip. Nodes in
    `on_chip` (the attention core, flash-style) also keep what they save for their own backward
    on chip (recomputed)."""
    producer: dict[int, tuple[str, str]] = {}
    consumers: dict[int, set[tuple[str, str]]] = defaultdict(set)
    for ev in events:
        for k, _ in ev.writes:
            producer.setdefault(k, (ev.node, ev.phase))
        for k, _ in ev.reads:
            consumers[k].add((ev.node, ev.phase))
    for k in out_keys:
        consumers[k].add((EXTERNAL, "fwd"))

    def internal(k, node, phase):
        if k not in producer or not consumers.get(k):
            return False
        if node in on_chip:
            return producer[k][0] == node and {n for n, _ in consumers[k]} == {node}
        return producer[k] == (node, phase) and consumers[k] == {(node, phase)}

    out: dict[tuple[str, str], list[int]] = defaultdict(list)
    for ev in events:
        out[ev.node, ev.phase] += [b for k, b in ev.reads + ev.writes
                                   if not internal(k, ev.node, ev.phase)]
    return out


@dataclass
class _Record:
    """One trace's measurements as polynomials in the micro-batch (nest.graph.fx_batch; degree 0
    only when traced at the micro-batch it reports), per fx node (name, opcode, target, op_kind,
    flop_scale, op_count, op_name, attention shape)."""

    kind: str
    variant: Variant
    module: torch.nn.Module
    graph: fx.Graph
    nodes: list[tuple]
    flops: dict[tuple[str, str], fx_batch.Poly]
    nbytes: dict[tuple[str, str], fx_batch.Poly]
    mm_shapes: dict[str, tuple]  # matmul node -> (m, n, k) polynomials
    out_bytes: dict[str, fx_batch.Poly]
    comms: list[tuple[str, str, str, fx_batch.Poly, int]]
    act: dict[str, fx_batch.Poly]
    boundary: fx_batch.Poly  # the layer output's bytes
    params: tuple[float, float]
    slotted: bool = False  # traced with the MoE slots per expert at their own tag


_GRAPHS: dict = {}  # (spec, kind, module structure) -> traced fx graph


def _graph(m: ModelSpec, kind: str, module: torch.nn.Module) -> fx.Graph:
    """The fx graph of `module`, traced once per structure: the control flow of the traced (non-
    leaf) forwards -- Block, MoE, Mlp, the embedding, head and MTP layers -- depends only on which
    submodules exist and on the spec (literals such as the hidden size), never on a size that a
    variant or the micro-batch changes (tests/test_fx_split.py compares with fresh traces)."""
    key = (m, kind, tuple((name, type(sub).__name__) for name, sub in module.named_modules()))
    graph = _GRAPHS.get(key)
    if graph is None:
        graph = _GRAPHS[key] = _Tracer().trace(module)
    return graph


@meta_cache.without_dynamo()
def _record(m: ModelSpec, kind: str, v: Variant, b: int, tag: int | None,
            slot_tag: int | None = None) -> _Record:
    """Trace layer `kind` at batch b; integers split by the batch tag (b itself) when tagged,
    and by the slot tag (the MoE slots per expert, nest.graph.fx_batch.slot_prime) if given."""
    module, inputs = tm.build_layer(m, kind, v, b, slots=slot_tag)
    graph = _graph(m, kind, module)
    exclude = _excluded(module)

    def poly(xs):
        return fx_batch.poly(xs, tag, slot_tag)

    attention = {n.name: n for n in graph.nodes if n.op == "call_module"
                 and getattr(module.get_submodule(n.target), "op_kind", None) == "attention"}

    # pass 1: no recomputation, forward + backward
    meter = _Meter()
    saved = _Saved(exclude, meter)
    with tm.comm_log() as log, torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        runner = _Runner(module, meter, graph=graph)
        with meter:
            out = runner.run(*inputs)
        if kind.startswith("block") and not TRACE_SELECTIVE:
            selective = _selective_from_pass1(saved, attention, runner.values, exclude)
        grad = torch.ones_like(out)
        meter.phase = "bwd"
        with meter:
            torch.autograd.backward(out, grad)
    comms = [(k, ph, g, poly([n]), shard) for k, ph, g, n, shard in log.raw]
    act = {"none": poly(saved.bytes.values())}

    # pass 2: forward only, attention core checkpointed (the same module, fresh inputs).
    # Full recomputation (the whole block under a reentrant checkpoint) keeps exactly the
    # block's input: its bytes, without a third pass (full_recompute_bytes; the traced pass
    # that checks it: tests/test_fx_graph.py).
    if kind.startswith("block"):
        if TRACE_SELECTIVE:
            selective = _selective_saved(module, m, kind, v, b, exclude, graph)
        act["selective"] = poly(selective.values())
        act["full"] = poly(_input_bytes(tm.layer_inputs(m, kind, v, b), exclude).values())
    else:  # embedding and head are never recomputed (as in the closed form)
        act["selective"] = act["full"] = act["none"]

    flops: dict[tuple[str, str], list] = defaultdict(list)
    shapes: dict[str, tuple] = {}
    for ev in meter.events:
        flops[ev.node, ev.phase].append(ev.flops)
        if ev.flops and ev.phase == "fwd":
            shapes.setdefault(ev.node, ev.shapes)
    nbytes = _node_bytes(meter.events, {tm.storage_key(out)}, set(attention))
    nodes, mm_shapes, out_bytes = [], {}, {}
    for n in graph.nodes:
        mod = module.get_submodule(n.target) if n.op == "call_module" else None
        op_kind = getattr(mod, "op_kind", None)
        shape = tuple(poly([x]) for x in mod.shape) if op_kind == "attention" else ()
        if op_kind == "matmul":
            a, w = shapes[n.name][-2:]  # mm(x, w), addmm(bias, x, w), bmm(x, w)
            mm_shapes[n.name] = tuple(poly([x]) for x in (a[-2], w[-1], a[-1]))  # (m, n, k)
        nodes.append((n.name, n.op, str(n.target), op_kind, getattr(mod, "flop_scale", 1.0),
                      getattr(mod, "op_count", 1), getattr(mod, "op_name", n.name), shape))
        out_bytes[n.name] = poly([t.numel() * t.element_size()
                                  for t in _tensors(runner.values.get(n.name))])
    return _Record(kind, v, module, graph, nodes, {k: poly(x) for k, x in flops.items()},
                   {k: poly(x) for k, x in nbytes.items()}, mm_shapes, out_bytes, comms, act,
                   poly([out.numel() * out.element_size()]), _params(module), bool(slot_tag))


def _materialise(r: _Record, mbs: int, num_slots: int = 0) -> TracedLayer:
    """The TracedLayer of record `r` at micro-batch `mbs` and `num_slots` MoE slots per expert
    (slot-tagged records; every number an exact integer sum, then the float arithmetic of a
    trace)."""

    def val(p) -> int:
        return fx_batch.at(p, mbs, num_slots)

    nodes, ops, totals = [], [], []
    for name, opcode, target, op_kind, scale, count, op_name, shape in r.nodes:
        f_by, b_by = (float(val(r.nbytes.get((name, ph), ()))) for ph in _PHASES)
        kind = op_kind or ("memory" if f_by else "view")
        f_fl, b_fl = (float(val(r.flops.get((name, ph), ()))) * scale for ph in _PHASES)
        nodes.append(NodeCost(name, opcode, target, kind, f_fl, b_fl, f_by, b_by,
                              float(val(r.out_bytes[name]))))
        if kind in ("comm", "view") or opcode in ("placeholder", "output"):
            continue
        if kind == "matmul":
            shape = r.mm_shapes[name]
        ops.append(Op(op_name, kind, f_fl / count, b_fl / count, f_by / count, b_by / count,
                      tuple(val(x) for x in shape), count))
        totals.append((f_fl, b_fl, f_by, b_by))
    extra = float(val(r.nbytes.get((EXTERNAL, "bwd"), ())))  # gradient accumulation, if any
    if extra:
        ops.append(Op("grad_accumulate", "memory", 0.0, 0.0, 0.0, extra))
        totals.append((0.0, 0.0, 0.0, extra))
    records = [(k, ph, g, val(p) / shard) for k, ph, g, p, shard in r.comms]
    act = {mode: float(val(p)) for mode, p in r.act.items()}
    cost = _layer_cost(r.kind, r.variant, ops, records, act, val(r.boundary), r.params)
    return TracedLayer(r.kind, r.variant, r.module, r.graph, nodes, cost, tuple(totals))


def _layer_trace(m: ModelSpec, kind: str, v: Variant, mbs: int) -> TracedLayer:
    """Trace and measure one layer at micro-batch `mbs` itself."""
    return _materialise(_record(m, kind, v, mbs, None), mbs)


TRACE_SELECTIVE = False  # True: the selective pass runs (the check of _selective_from_pass1)


def _selective_from_pass1(saved: _Saved, attention: dict, values: dict,
                          exclude: set[int]) -> dict[int, int]:
    """The storages a forward with the attention core checkpointed saves, from the pass without
    recomputation: what any other node saved, and the attention nodes' tensor inputs (all a
    reentrant checkpoint saves; it runs the core without grad, so the core's own saves vanish and
    its output keeps its storage)."""
    out = {k: b for k, b in saved.bytes.items() if saved.savers[k] - set(attention)}
    ckpt = _Saved(exclude)
    for node in attention.values():
        for arg in node.all_input_nodes:
            for t in _tensors(values.get(arg.name)):
                ckpt.pack(t)
    return {**out, **ckpt.bytes}


def _selective_saved(gm, m, kind, v, mbs, exclude, graph=None) -> dict[int, int]:
    s = _Saved(exclude)
    with tm.comm_log(), torch.autograd.graph.saved_tensors_hooks(s.pack, s.unpack):
        _Runner(gm, selective=True, graph=graph).run(*tm.layer_inputs(m, kind, v, mbs))
    return s.bytes


def selective_bytes(gm, m, kind, v, mbs, exclude) -> float:
    """Saved bytes of one forward with the attention core checkpointed."""
    return float(sum(_selective_saved(gm, m, kind, v, mbs, exclude).values()))


def _input_bytes(inputs, exclude) -> dict[int, int]:
    return {tm.storage_key(t): t.untyped_storage().nbytes() for t in inputs
            if isinstance(t, torch.Tensor) and tm.storage_key(t) not in exclude}


def full_recompute_bytes(inputs, exclude) -> float:
    """A reentrant checkpoint of the whole block saves its tensor inputs and nothing else."""
    return float(sum(_input_bytes(inputs, exclude).values()))


def full_bytes_traced(gm, inputs, exclude) -> float:
    """The same bytes measured by running the checkpointed block (the check of the above)."""
    s = _Saved(exclude)
    with tm.comm_log(), torch.autograd.graph.saved_tensors_hooks(s.pack, s.unpack):
        checkpoint(lambda *a: _Runner(gm).run(*a), *inputs, use_reentrant=True,
                   preserve_rng_state=False)
    return s.total


def _collectives(records) -> tuple[Collective, ...]:
    counts = Counter(records)
    order = {"fwd": 0, "bwd": 1}
    keys = sorted(counts, key=lambda r: (order[r[1]], r[2], r[0], r[3]))
    return tuple(Collective(kind, phase, group, nbytes, counts[kind, phase, group, nbytes])
                 for kind, phase, group, nbytes in keys)


def _params(module: torch.nn.Module) -> tuple[float, float]:
    dense = expert = 0
    for name, p in module.named_parameters():
        if "experts_" in name:
            expert += p.numel()
        else:
            dense += p.numel()
    return float(dense), float(expert)


def _layer_cost(kind, v, ops, records, act, out_nbytes, params) -> LayerCost:
    dense, expert = params
    names = tuple(o.name for o in ops)
    if kind.startswith("block"):
        recompute = {"none": (), "selective": tuple(o.name for o in ops if o.kind == "attention"),
                     "full": names}
    else:
        recompute = {"none": (), "selective": (), "full": ()}
    # boundary activation: Megatron's scatter/gather optimisation sends 1/t per tp rank
    out_bytes = 0.0 if kind == "head" else out_nbytes / (v.tp if not v.sp else 1)
    return LayerCost(tuple(ops), _collectives(records), dense, expert, act, recompute,
                     float(out_bytes))


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def _dims(m: ModelSpec) -> ModelSpec:
    """The spec with everything that does not change the modules blanked (cache key)."""
    return dataclasses.replace(m, name="", source_file="", published_num_params=None,
                               parallel_variants=ParallelVariants())


@lru_cache(maxsize=1024)
def _rec(m: ModelSpec, kind: str, v: Variant, mbs: int | None, split: bool) -> _Record | None:
    """The record of layer `kind` under `v`: traced at micro-batch `mbs`, or at the batch tag
    (nest.graph.fx_batch) when mbs is None, with MoE slots per expert that are not linear in the
    batch at the slot tag (None where the tags do not apply); with `split`, tp and cp above 4
    derived from degrees 2 and 4 (nest.graph.fx_split) where they can be, from bases tagged as
    the variant is (a cp base may be batch-linear where the variant is not)."""
    slotted = mbs is None and fx_batch.slot_tagged(m, kind, v)
    if split:
        for axis in ("tp", "cp"):
            if fx_split.derivable(m, v, axis, mbs):
                tm._check(m, v, 1)  # the trace's variant checks
                r2, r4 = (_rec(m, kind, b, mbs, split) for b in fx_split.bases(v, axis))
                if r2 and r4 and r2.slotted == r4.slotted == slotted:
                    r = fx_split.derive(r2, r4, v, axis)
                    if r is not None:
                        return r
    if mbs is not None:
        return _record(m, kind, v, mbs, None)
    tag = fx_batch.tag_prime(m)
    try:
        return _record(m, kind, v, tag, tag, fx_batch.slot_prime(m, tag) if slotted else None)
    except fx_batch.NotTagged:
        return None


def _tagged(m: ModelSpec, kind: str, v: Variant) -> _Record | None:
    """The record at the batch tag, no degree derived (None where the tag does not apply)."""
    return _rec(m, kind, v, None, False)


@lru_cache(maxsize=2048)
def _cached(m: ModelSpec, kind: str, v: Variant, mbs: int, derive_mbs: bool = True,
            derive_split: bool = True) -> TracedLayer:
    r = _rec(m, kind, v, None, derive_split) if derive_mbs else None
    if r is not None and r.slotted:  # the tagged trace pads the slots: so must the micro-batch
        if fx_batch.padded(m, v, mbs):
            return _materialise(r, mbs, fx_batch.slots(m, v, mbs))
        r = None
    return _materialise(r or _rec(m, kind, v, mbs, derive_split), mbs)


def clear_caches() -> None:
    """Forget every trace (cold timings, tests)."""
    _cached.cache_clear()
    _rec.cache_clear()
    _GRAPHS.clear()
    _num_params.cache_clear()


def trace_layer(m: ModelSpec, kind: str, v: Variant | None = None, mbs: int = 1,
                derive_mbs: bool = True, derive_split: bool = True) -> TracedLayer:
    """Trace and measure one layer kind (embedding | block | head) of `m` under variant `v`
    (default: no parallelism). Layers without experts (embedding, head, a dense block) do not
    depend on ep: they are traced once at ep = 1 and shared by every ep. Every micro-batch size
    comes from one trace at a tagged batch (nest.graph.fx_batch) unless derive_mbs is False
    (then the trace runs at `mbs` itself: the check of the derivation); tp and cp above 4 come
    from the degrees 2 and 4 (nest.graph.fx_split) unless derive_split is False."""
    v = v or Variant()
    if v.ep > 1 and (kind == "embedding" or "dense" in kind or (kind == "head"
                                                                 and not m.mtp_layers)):
        v = dataclasses.replace(v, ep=1)
    return _cached(_dims(m), kind, v, mbs, derive_mbs, derive_split)


@lru_cache(maxsize=256)
@meta_cache.without_dynamo()
def _num_params(m: ModelSpec, kind: str) -> float:
    module, _ = tm.build_layer(m, kind, Variant())
    n = sum(p.numel() for p in module.parameters())
    if kind == "head" and m.tied_embeddings:
        n -= module.lm_head.weight.numel()  # the tied copy is counted once, in the embedding
    if kind == "head":  # MTP modules use the main embedding table: counted there
        n -= sum(mtp.embed.lookup.weight.numel() for mtp in module.mtp)
    return float(n)


def num_params(m: ModelSpec, kind: str) -> float:
    """Unsharded parameters of one layer of `kind`, counted once for the whole model."""
    return _num_params(_dims(m), kind)


def total_params(m: ModelSpec) -> float:
    return (num_params(m, "embedding") + sum(num_params(m, k) for k in tm.block_kinds(m))
            + num_params(m, "head"))


def layer_cost(m: ModelSpec, kind: str, v: Variant, mbs: int = 1, derive_ep: bool = True,
               derive_mbs: bool = True, derive_split: bool = True) -> LayerCost:
    """trace_layer(...).cost; an expert-parallel variant with ep > 4 of a layer with experts
    derived exactly from its ep = 2 and ep = 4 traces (nest.graph.fx_ep) unless derive_ep is
    False or the derivation does not apply."""
    if derive_ep and fx_ep.can_derive(m.num_experts, v):
        t2, t4 = (trace_layer(m, kind, b, mbs, derive_mbs, derive_split)
                  for b in fx_ep.bases(v))
        if t4.variant.ep == fx_ep.BASE[1]:  # the layer depends on ep (else traced at ep = 1)
            cost = fx_ep.derive(t2, t4, m.num_experts, v.ep)
            if cost is not None:
                return cost
    return trace_layer(m, kind, v, mbs, derive_mbs, derive_split).cost


def build_layer_graph_fx(model: ModelSpec, mbs: int = 1,
                         variants: list[Variant] | None = None,
                         derive_ep: bool = True, derive_mbs: bool = True,
                         derive_split: bool = True) -> LayerGraph:
    """The layer graph of `model` measured from traced torch modules (same contract as
    closed_form.build_layer_graph; identical blocks share one LayerCost). derive_ep=False
    traces every expert-parallel variant (layer_cost; the check of the derivation),
    derive_mbs=False traces at `mbs` itself, derive_split=False every tp and cp (trace_layer)."""
    variants = variants or variants_of(model)
    blocks = tm.block_kinds(model)  # identical blocks share one kind (DeepSeek: dense first)
    cost = {kind: {v.key: layer_cost(model, kind, v, mbs, derive_ep, derive_mbs, derive_split)
                   for v in variants}
            for kind in ("embedding", *dict.fromkeys(blocks), "head")}
    layers = [Layer(0, "embedding", "embedding", num_params(model, "embedding"), cost["embedding"])]
    for i, kind in enumerate(blocks):
        layers.append(Layer(i + 1, f"block_{i}", "block", num_params(model, kind), cost[kind]))
    layers.append(Layer(model.num_layers + 1, "head", "head", num_params(model, "head"),
                        cost["head"]))
    return LayerGraph(model.name, mbs, model.seq_len, model.hidden_size, model.tied_embeddings,
                      list(variants), layers, source="torch_fx")

"""Rank order strings -> each stage's device ids, and which orders Megatron realises exactly.

Rank = device id; a stage's ids are listed replica by replica, inner rank (e*cp + c)*tp + t (the
(dp, ep, cp, tp) listing of nest.problem.evaluate.inner_groups).

Sources: megatron-core `parallel_state.py` (NVIDIA/Megatron-LM, read at commit d98e8a64):
`generate_masked_orthogonal_rank_groups`, `RankGenerator` and `initialize_model_parallel(...,
order="tp-cp-ep-dp-pp")`; Megatron-LM `megatron/training/initialize.py` (the CLI passes
order='tp-cp-ep-dp-pp', or 'tp-cp-ep-pp-dp' with --use-tp-pp-dp-mapping).

Order strings. An order is a '-'-joined permutation of tp, cp, ep, dp, pp, fastest first: rank =
sum of coordinate x stride, each stride the product of the sizes before it (Megatron's mixed radix,
`RankGenerator`). Legacy names: replica_major = tp-cp-ep-dp-pp (Megatron-LM's default),
stage_major = tp-cp-ep-pp-dp (--use-tp-pp-dp-mapping).

How megatron-core builds groups from an order (re-derived from its source, checked against a
verbatim copy in tests/test_placement_orders.py). It runs two RankGenerators on the same order:
    dense:  tp, cp, pp as given, ep size 1, dp size dp_M = world / (tp*cp*pp)
            (our dp x ep: ep ranks run distinct micro-batches inside Megatron's data parallelism)
    expert: tp (expert tp = tp here), ep, pp as given, cp size 1, dp size world / (tp*ep*pp)
            (our dp x cp)
and asserts order.endswith('pp') or pp == 1 or both dp sizes agree (cp == ep). Our model (nest.
evaluate.inner_groups) prices tp, cp, ep groups that vary one coordinate, dense gradients over
(dp, ep, cp) and expert gradients over (dp, cp). The two agree exactly when
    (ep == 1 or ep is adjacent to dp) and (cp == 1 or cp is adjacent to dp)
in the order after deleting its size-1 names: then the dense dp digit is (dp, ep) and the expert
dp digit is (dp, cp). Otherwise Megatron folds ep over cp (MoE parallel folding: with cp > 1 and
ep > 1 its ep groups share ranks with its cp groups, e.g. under both Megatron-LM CLI orders) or
splits tp across the tp/ep digits, which our model does not price.

Decision, "exact over placement" (what launcher_orders returns and the solver may search): every
order that megatron-core's initialize_model_parallel(order=...) accepts AND for which the groups it
builds are exactly the groups the harness prices, i.e. a permutation of all five names with
(a) order.endswith('pp') or pp == 1 or cp == ep, and (b) the adjacency rule above; orders giving
the identical per-stage device lists are listed once (the representative closest to
tp-cp-ep-dp-pp; that order first where it qualifies).
Megatron-LM's CLI expresses only the two legacy orders (where they are in this set); every other
order needs megatron-core's `order` argument or, for the Megatron-LM CLI, a rank map that pins
each rank to its device (nest.interfaces.export). Custom (non-order) device lists are outside this set.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import permutations

import numpy as np

from nest.common.errors import PlanError

DIMS = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
LEGACY = {"replica_major": "tp-cp-ep-dp-pp", "stage_major": "tp-cp-ep-pp-dp"}
CLI_ORDERS = ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")  # Megatron-LM's CLI: default, tp-pp-dp mapping


def canonical_order(order: str) -> str:
    """The order string of a legacy name or an order string; PlanError if it is neither."""
    o = LEGACY.get(order, order)
    if not isinstance(o, str) or sorted(o.split("-")) != sorted(DIMS):
        raise PlanError(f"placement '{order}': expected {' | '.join(LEGACY)} or a '-'-joined "
                        f"permutation of {', '.join(DIMS)} (fastest first)")
    return o


def is_order(placement: str) -> bool:
    try:
        canonical_order(placement)
    except PlanError:
        return False
    return True


def strides(pp: int, dp: int, tp: int, cp: int, ep: int, order: str) -> dict[str, int]:
    """Rank stride of each dimension under `order` (Megatron's prefix products)."""
    sizes = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
    out, s = {}, 1
    for name in canonical_order(order).split("-"):
        out[name] = s
        s *= sizes[name]
    return out


def stage_device_ids(pp: int, dp: int, tp: int, cp: int, ep: int,
                     order: str) -> list[tuple[int, ...]]:
    """Device ids of every pipeline stage when rank = device id and ranks follow `order`; each
    stage's ids in the canonical listing (dp, ep, cp, tp), tp fastest."""
    return [tuple(row) for row in stage_id_array(pp, dp, tp, cp, ep, canonical_order(order)).tolist()]


@lru_cache(maxsize=4096)
def stage_id_array(pp: int, dp: int, tp: int, cp: int, ep: int, order: str) -> np.ndarray:
    """`stage_device_ids` as a [pp, ids] array for a canonical order string (cached)."""
    st = strides(pp, dp, tp, cp, ep, order)
    grid = sum(np.arange(n).reshape([-1 if i == k else 1 for i in range(5)]) * st[name]
               for k, (name, n) in enumerate((("pp", pp), ("dp", dp), ("ep", ep), ("cp", cp),
                                               ("tp", tp))))
    return grid.reshape(pp, -1)


def _nontrivial(order: str, sizes: dict[str, int]) -> list[str]:
    return [n for n in canonical_order(order).split("-") if sizes[n] > 1]


def expressible(tp: int, cp: int, ep: int, dp: int, pp: int, order: str) -> bool:
    """megatron-core accepts `order` and builds exactly the groups the harness prices (module
    docstring: the endswith('pp') assertion and the adjacency rule)."""
    o = canonical_order(order)
    if not (o.endswith("pp") or pp == 1 or cp == ep):
        return False
    sizes = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
    nt = _nontrivial(o, dict(sizes, dp=2))  # dp's position matters even when dp == 1
    for name in ("ep", "cp"):
        if sizes[name] > 1 and abs(nt.index(name) - nt.index("dp")) != 1:
            return False
    return True


def launch_rank(placement: str) -> tuple[int, int]:
    """How far a placement is from what a Megatron-LM user launches (smaller: closer), the tie
    rule of nest.planners.ties: (0, 0) Megatron-LM's default order tp-cp-ep-dp-pp (`replica_major`),
    (1, 0) the other order its CLI offers (tp-cp-ep-pp-dp, --use-tp-pp-dp-mapping:
    `stage_major`), then (2, k) any other order with k pairs out of the default, (3, 0) a custom
    device list (not an order)."""
    if not is_order(placement):
        return (3, 0)
    o = canonical_order(placement)
    if o == DEFAULT_ORDER:
        return (0, 0)
    if o in CLI_ORDERS:
        return (1, 0)
    return (2, _inversions(o))


def _inversions(order: str) -> int:
    pos = [DIMS.index(n) for n in order.split("-")]
    return sum(a > b for i, a in enumerate(pos) for b in pos[i + 1:])


def all_orders() -> list[str]:
    """Every permutation of the five names, closest to tp-cp-ep-dp-pp first: by the number of
    pairs out of that order, then keeping the slowest names in place longest (deterministic)."""
    perms = ["-".join(p) for p in permutations(DIMS)]
    return sorted(perms, key=lambda o: (_inversions(o), [-DIMS.index(n)
                                                         for n in reversed(o.split("-"))]))


def launcher_orders(tp: int, cp: int, ep: int, dp: int, pp: int) -> tuple[str, ...]:
    """Every expressible order (module docstring), one per distinct per-stage device layout: the
    first of each layout in the ranking tp-cp-ep-dp-pp, tp-cp-ep-pp-dp, then all_orders(), and
    listed in that ranking (so tp-cp-ep-dp-pp first where it is expressible)."""
    seen, out = set(), []
    for o in (*CLI_ORDERS, *all_orders()):
        if not expressible(tp, cp, ep, dp, pp, o):
            continue
        key = tuple(stage_device_ids(pp, dp, tp, cp, ep, o))
        if key not in seen:
            seen.add(key)
            out.append(o)
    return tuple(out)


def rank_devices(ids, tp: int, cp: int, ep: int, dp: int, pp: int, order: str) -> np.ndarray:
    """The device of each Megatron rank when ranks follow `order` and stage j of the plan holds
    ids[j] (the (dp, ep, cp, tp) listing): the rank with the same coordinates as the device's
    slot (stage_id_array lists each slot's rank)."""
    ranks = stage_id_array(pp, dp, tp, cp, ep, canonical_order(order))
    dev = np.empty(ranks.size, dtype=np.int64)
    dev[ranks.ravel()] = np.asarray(ids, dtype=np.int64).reshape(pp, -1).ravel()
    return dev


def one_run_per_node(devices: np.ndarray, per_node: int) -> bool:
    """Every node holds one run of consecutive ranks (`devices`: the device of rank 0, 1, ...):
    torchrun starts one agent per node with a block of consecutive ranks, and only devices within
    a node can be pinned (CUDA_VISIBLE_DEVICES)."""
    nodes = np.asarray(devices) // per_node
    runs = nodes[np.r_[True, nodes[1:] != nodes[:-1]]]
    return len(runs) == len(np.unique(runs))


def cli_orders(tp: int, cp: int, ep: int, dp: int, pp: int) -> list[str]:
    """The orders Megatron-LM's CLI offers that build the priced groups for these degrees."""
    return [o for o in CLI_ORDERS if expressible(tp, cp, ep, dp, pp, o)]


def launch_order(ids, tp: int, cp: int, ep: int, dp: int, pp: int, per_node: int) -> str | None:
    """The Megatron-LM CLI order that launches a plan whose stage j holds ids[j] exactly as
    priced: the first CLI order whose ranks are the devices themselves, else the first whose rank
    map gives every node one run of consecutive ranks (the export pins each rank to its device);
    None where none does (the export then re-orders the plan and re-scores it)."""
    maps = {o: rank_devices(ids, tp, cp, ep, dp, pp, o) for o in cli_orders(tp, cp, ep, dp, pp)}
    for o, dev in maps.items():
        if (dev == np.arange(len(dev))).all():
            return o
    return next((o for o, dev in maps.items() if one_run_per_node(dev, per_node)), None)


@lru_cache(maxsize=65536)
def launches_as_priced(tp: int, cp: int, ep: int, dp: int, pp: int, order: str,
                       per_node: int) -> bool:
    """A plan placed by `order` (a legacy name or an order string) launches as priced through
    Megatron-LM's CLI on nodes of `per_node` devices (`launch_order`)."""
    ids = stage_id_array(pp, dp, tp, cp, ep, canonical_order(order))
    return launch_order(ids, tp, cp, ep, dp, pp, per_node) is not None


def interleaves(pp: int, overlap_p2p: bool) -> bool:
    """Whether Megatron-LM runs an interleaved schedule on pp stages: pp >= 2, and pp >= 3 when
    the pipeline sends do not overlap (validate_args asserts "pipeline-model-parallel size should
    be greater than 2" for an interleaved schedule without overlap_p2p_comm: two sends between the
    same two ranks in one batch). The search (nest.solver.launchable.virtual_options) and the
    export (nest.interfaces.export) both ask this."""
    return pp >= (2 if overlap_p2p else 3)


def runs_context_parallel(attention: str) -> bool:
    """Whether cp > 1 launches with the attention kernel a plan is priced with (nest.graph.
    attention): Transformer Engine has no unfused kernel under context parallelism ("Disabling
    UnfusedDotProductAttention as it does not support context parallelism", dot_product_attention/
    utils.py) and Megatron-LM's own core asserts cp 1. The launchable space
    (nest.solver.launchable.launchable_space) and the export both ask this."""
    return attention != "unfused"


def megatron_groups(tp: int, cp: int, ep: int, dp: int, pp: int,
                    order: str) -> dict[str, set[frozenset[int]]]:
    """Rank groups megatron-core's initialize_model_parallel builds for `order` (re-derived from
    its two RankGenerators; `dp` is ours, so Megatron's dense dp is dp*ep, its expert dp dp*cp).
    Keys: tp, cp, dp (dense, Megatron's dp = our dp x ep), dp_cp (dense gradients), pp,
    ep, expert_tp, expert_dp."""
    o = canonical_order(order).split("-")
    dense = {"tp": tp, "cp": cp, "ep": 1, "dp": dp * ep, "pp": pp}
    expert = {"tp": tp, "cp": 1, "ep": ep, "dp": dp * cp, "pp": pp}
    world = tp * cp * ep * dp * pp

    def groups(sizes: dict[str, int], vary: tuple[str, ...]) -> set[frozenset[int]]:
        out: dict[tuple, set[int]] = {}
        for r in range(world):
            k, x = {}, r
            for n in o:
                k[n] = x % sizes[n]
                x //= sizes[n]
            out.setdefault(tuple(k[n] for n in o if n not in vary), set()).add(r)
        return {frozenset(s) for s in out.values()}

    return {"tp": groups(dense, ("tp",)), "cp": groups(dense, ("cp",)),
            "dp": groups(dense, ("dp",)), "dp_cp": groups(dense, ("dp", "cp")),
            "pp": groups(dense, ("pp",)), "ep": groups(expert, ("ep",)),
            "expert_tp": groups(expert, ("tp",)), "expert_dp": groups(expert, ("dp",))}


def harness_groups(stages: list[tuple[int, ...]], tp: int, cp: int, ep: int,
                   dp: int) -> dict[str, set[frozenset[int]]]:
    """The same group kinds as megatron_groups, as the harness prices them from per-stage device
    lists (nest.problem.evaluate.inner_groups' listing; pp groups: the same position in every stage),
    plus dp_ours (our data-parallel coordinate alone, which Megatron builds no group for)."""
    import numpy as np

    kinds = (("tp", (3,)), ("cp", (2,)), ("ep", (1,)), ("dp", (0, 1)), ("dp_cp", (0, 1, 2)),
             ("expert_tp", (3,)), ("expert_dp", (0, 2)), ("dp_ours", (0,)))
    out: dict[str, set[frozenset[int]]] = {k: set() for k, _ in kinds}
    for ids in stages:
        a = np.asarray(ids).reshape(dp, ep, cp, tp)
        for key, axes in kinds:
            keep = [i for i in range(4) if i not in axes]
            rows = a.transpose(*keep, *axes).reshape(-1, int(np.prod([a.shape[i] for i in axes])))
            out[key] |= {frozenset(r.tolist()) for r in rows}
    out["pp"] = {frozenset(col) for col in zip(*stages)}
    return out

"""A Problem is immutable in fact (issue 23, item 3).

Facts checked: nothing reachable from a problem's layer graph, or from what its cache hands out,
can be written (every container is a tuple or a read-only mapping, every array read-only, every
dataclass frozen: found by walking the objects, not by listing fields); no two problems share a
cache entry, even when they share the (frozen) graph that nest.graph.build_graph caches; the
cache evicts the least recently used entry of a store and nothing else (a brute-force replay);
a Problem whose fields disagree is refused at construction.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import numpy as np
import pytest

from nest.costs.cache import ProblemCache
from nest.costs.groups import group_terms
from nest.costs.layers import layer_table
from nest.costs.stage import Options, stage_cost
from nest.costs.table import CostTable
from nest.graph.layer_graph import Variant
from nest.problem.problem import Problem, make_problem
from nest.spec.settings import CostScale, TrainingSettings

MODES = ("none", "full")


def writable(x, path="", seen=None) -> list[str]:
    """Paths of everything mutable reachable from x."""
    seen = set() if seen is None else seen
    if id(x) in seen or isinstance(x, (str, bytes, int, float, bool, type(None), np.generic)):
        return []
    seen.add(id(x))
    if isinstance(x, np.ndarray):
        return [path] if x.flags.writeable else []
    if isinstance(x, (list, dict, set, bytearray)):
        return [f"{path} ({type(x).__name__})"]
    if isinstance(x, MappingProxyType):
        return [p for k, v in x.items() for p in writable(v, f"{path}[{k!r}]", seen)]
    if isinstance(x, (tuple, frozenset)):
        return [p for i, v in enumerate(x) for p in writable(v, f"{path}[{i}]", seen)]
    if dataclasses.is_dataclass(x):
        own = [] if x.__dataclass_params__.frozen else [f"{path} (not frozen)"]
        return own + [p for f in dataclasses.fields(x)
                      for p in writable(getattr(x, f.name), f"{path}.{f.name}", seen)]
    return []


@pytest.fixture(scope="module")
def problem():
    return make_problem("tiny_llama", "tiny_cluster", 4,
                        training=TrainingSettings(global_batch=8),
                        variants=(Variant(tp=2), Variant(tp=2, sp=True)))


def test_nothing_in_the_graph_can_be_written(problem):
    assert writable(problem.graph, "graph") == []
    assert writable(problem.described, "described") == []
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.graph = problem.described
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.graph.layers[0].costs = {}
    with pytest.raises(TypeError):
        problem.graph.layers[1].costs[Variant().key].act_bytes["none"] = 0.0
    with pytest.raises(AttributeError):
        problem.costs.scale = 2.0


def test_nothing_the_cache_hands_out_can_be_written(problem):
    v = Variant(tp=2, sp=True)
    lt = layer_table(problem, v, MODES)
    ids = np.arange(2)
    gt = group_terms(problem, lt, ids, 1)
    stage_cost(problem, lt, ids, 1, Options((0, 1), MODES), 1)  # fills the grid entry
    assert writable(lt, "layer_table") == writable(gt, "group_terms") == []
    kept = list(problem.cache.items())
    assert {k[0] for _, k, _ in kept if isinstance(k, tuple)} >= {"group", "dp", "grid"}
    for store, key, entry in kept:
        assert writable(entry, f"{store}{key}") == []
    with pytest.raises(ValueError, match="read-only"):
        lt.fwd_L[0] = 0.0


def test_no_two_problems_share_a_cache_entry(problem):
    v = Variant()
    base, again = (make_problem("tiny_llama", "tiny_cluster", 4,
                                training=TrainingSettings(global_batch=8)) for _ in range(2))
    assert again.described is base.described  # one frozen graph from build_graph's cache
    others = [base, again, problem.with_training(global_batch=16), problem.with_hardware(hbm_bytes=1e9),
              problem.with_training(cost_scale=CostScale(compute=1.5))]
    tables = [layer_table(p, v, MODES) for p in (problem, *others)]
    assert len({id(p.cache) for p in (problem, *others)}) == len(tables)
    assert len({id(t) for t in tables}) == len(tables)
    assert len({id(t.fwd_L) for t in tables}) == len(tables)
    assert tables[-1].fwd_L == pytest.approx(1.5 * tables[0].fwd_L)  # its own scale, not shared
    assert np.array_equal(tables[2].fwd_L, tables[0].fwd_L)


def test_cache_evicts_the_least_recently_used_entry_only():
    cache, made = ProblemCache(entries=3), []

    def get(store, key):
        return cache.get(store, key, lambda: made.append((store, key)) or (store, key))

    # the replay: a list kept in recency order, the oldest dropped past 3 entries per store
    order: dict[str, list] = {}
    expected_made = []
    for store, key in [("a", 1), ("a", 2), ("a", 3), ("a", 1), ("a", 4), ("b", 1), ("a", 2),
                       ("a", 3), ("a", 1), ("b", 1)]:
        assert get(store, key) == (store, key)
        q = order.setdefault(store, [])
        if key in q:
            q.remove(key)
        else:
            expected_made.append((store, key))
            if len(q) == 3:
                q.pop(0)
        q.append(key)
    assert made == expected_made
    assert len(cache) == sum(len(q) for q in order.values())


def test_a_problem_whose_fields_disagree_is_refused(problem):
    f = {x.name: getattr(problem, x.name) for x in dataclasses.fields(problem) if x.init}
    bad_costs = CostTable(problem.graph, problem.hardware, problem.costs.profile,
                          problem.compute, scale=2.0)
    with pytest.raises(ValueError, match="Problem.build"):
        Problem(**{**f, "costs": bad_costs})
    with pytest.raises(ValueError, match="viewed with"):
        Problem(**{**f, "graph": problem.described})
    scaled = problem.training.with_(cost_scale=CostScale(communication=2.0))
    with pytest.raises(ValueError, match="Problem.build"):
        Problem(**{**f, "training": scaled})
    built = Problem.build(problem.model, problem.cluster, problem.described, scaled)
    assert built.cluster.comm_scale == 2.0 and built.graph is problem.graph


def test_named_stores_keep_their_own_number_of_entries():
    """nest.costs.cache.STORE_ENTRIES: a store named there keeps that many entries (not the
    cache's ENTRIES), still evicting the least recently used one past it; other stores keep
    ENTRIES."""
    from nest.costs.cache import STORE_ENTRIES

    store = "memory_aware_bound"
    n = STORE_ENTRIES[store]
    cache, made = ProblemCache(entries=3), []
    for k in range(n + 1):
        cache.get(store, k, lambda k=k: made.append(k) or k)
    cache.get(store, 1, lambda: made.append("again") or 1)  # kept: not made again
    assert "again" not in made
    cache.get(store, 0, lambda: made.append("evicted") or 0)  # the oldest was dropped
    assert made[-1] == "evicted"
    for k in range(5):
        cache.get("other", k, lambda k=k: k)
    assert len(cache) == n + 3

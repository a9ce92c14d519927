"""nest.network.collectives prices many groups at once (`coefficients_rows`: the flat ring of
every row over arrays, the hierarchical parts in one batch per sub-group size); every line must
be the float the one-group-at-a-time code gave. `reference_lines` below is that code as it was
before the batching (issue 27's solve-time work), kept here as the slow path: it is compared
bit for bit on random clusters (tests/strategies.py: 2-4 levels, oversubscribed, flattened)
and on shipped clusters with NVLS (GB200 NVL72, DGX H100), rails and a torus, over contiguous,
strided, aligned, uneven and random groups, each batch mixing them, for every kind."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nest.network import collectives as col
from nest.network.nvls import nvls_lines
from nest.spec.catalog import cluster_from_dict, load_cluster
from strategies import cluster_dicts

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def reference_ring(cluster, kind, group):
    n = len(group)
    g = np.sort(np.asarray(group, dtype=np.int64))
    levels = cluster.levels
    steps = 2 * (n - 1) if kind == "all_reduce" else n - 1
    nxt = np.roll(g, -1)
    lvl = np.full(n, len(levels) - 1)
    for i in reversed(range(len(levels))):
        size = levels[i].devices_per_group
        lvl = np.where(g // size == nxt // size, i, lvl)
    blk = g // levels[0].devices_per_group
    last = np.flatnonzero(np.append(blk[1:] != blk[:-1], True))
    members = np.diff(last, prepend=-1)
    exit_level = np.where(lvl[last] > 0, lvl[last], -1)
    leaves = exit_level > 0
    bw = [col.path_bandwidth(cluster, i) for i in range(len(levels))]
    load = float(np.max((members - leaves) / members / bw[0]))
    if leaves.any():
        load = max(load, float(np.max(1 / members[leaves] / np.asarray(bw)[exit_level[leaves]])))
    top = col.span_level(cluster, (int(g[0]), int(g[-1])))
    return steps * cluster.levels[top].latency_s, steps / n * load


def reference_lines(cluster, kind, group):
    group = tuple(sorted(group))
    n = len(group)
    top = col.span_level(cluster, (group[0], group[-1]))
    if kind == "all_to_all":
        return (col._all_to_all(cluster, group),)
    flat = reference_ring(cluster, kind, group)
    block = col._block_rings(cluster, kind, group, top)
    rings = [flat] if block is None else [flat, block]
    rings += nvls_lines(cluster, kind, group, top, col.path_bandwidth(cluster, top))
    if top == 0:
        return col._envelope(rings) if len(rings) > 1 else (flat,)
    below = cluster.levels[top - 1].devices_per_group
    g = np.asarray(group, dtype=np.int64)
    sub = g // below
    first = np.flatnonzero(np.insert(sub[1:] != sub[:-1], 0, True))
    sizes = np.diff(first, append=n)
    if (sizes != sizes[0]).any() or sizes[0] == 1:
        return col._envelope(rings) if len(rings) > 1 else (flat,)
    n_in = int(sizes[0])
    inner, outer = group[:n_in], tuple(g[first].tolist())
    if kind == "all_reduce":
        parts = [(reference_lines(cluster, "reduce_scatter", inner), 1.0),
                 (reference_lines(cluster, "all_reduce", outer), 1.0 / n_in),
                 (reference_lines(cluster, "all_gather", inner), 1.0)]
    else:
        parts = [(reference_lines(cluster, kind, inner), 1.0),
                 (reference_lines(cluster, kind, outer), 1.0 / n_in)]
    hier = [(0.0, 0.0)]
    for lines, scale in parts:
        hier = [(a0 + a, b0 + b * scale) for a0, b0 in hier for a, b in lines]
    return col._envelope([*rings, *hier])


def groups_of(rng, num_devices: int, n: int, count: int) -> np.ndarray:
    """`count` sorted groups of n ids: contiguous at random offsets, strided, aligned blocks
    and random subsets, mixed in one batch."""
    out = []
    for _ in range(count):
        how = rng.integers(4)
        if how == 0:
            start = rng.integers(0, num_devices - n + 1)
            g = np.arange(start, start + n)
        elif how == 1 and num_devices // n > 1:
            stride = rng.integers(2, num_devices // n + 1)
            g = rng.integers(0, num_devices - stride * (n - 1)) + stride * np.arange(n)
        elif how == 2 and num_devices // n > 1:
            g = n * rng.integers(0, num_devices // n) + np.arange(n)
        else:
            g = rng.choice(num_devices, size=n, replace=False)
        out.append(np.sort(g))
    return np.array(out, dtype=np.int64)


def assert_rows_as_reference(cluster, num_devices: int, seed: int, sizes, count: int = 12):
    rng = np.random.default_rng(seed)
    for n in sizes:
        if n > num_devices:
            continue
        rows = groups_of(rng, num_devices, n, count)
        for kind in KINDS:
            col._LINES.clear()  # price every row afresh, in one batch
            got = col.coefficients_rows(cluster, kind, rows)
            want = [reference_lines(cluster, kind, tuple(r.tolist())) for r in rows]
            assert got == want, (kind, n)
            assert [col.coefficients(cluster, kind, tuple(r)) for r in rows] == want  # cached


@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cluster_dicts(max_devices=256), st.integers(0, 2**31))
def test_rows_equal_one_group_at_a_time_on_random_clusters(spec, seed):
    d, n = spec
    total = d["levels"][-1]["devices_per_group"]
    cluster = cluster_from_dict(d, "hypothesis cluster", total)
    assert_rows_as_reference(cluster, total, seed, sorted({2, 3, n, max(2, total // 4), total}))


@pytest.mark.parametrize("name,num", [("gb200_nvl72", 1152), ("dgx_h100_rail_superpod", 256),
                                      ("dgx_h100_superpod", 64), ("tpuv4_torus", 256)])
def test_rows_equal_one_group_at_a_time_on_shipped_clusters(name, num):
    c = load_cluster(name, num)
    assert_rows_as_reference(c, num, 7, (2, 8, 16, 64, 72, 96, 144, 256), count=8)

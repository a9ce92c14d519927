"""The one stage-cost kernel (nest.costs.stage): the grid the solver reads and the one cell the
evaluator reads are the same numbers; the breakdown adds up to the totals; the ZeRO schedule and
the memory model match their closed forms."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nest.costs.memory import peak, shard_sizes
from nest.costs.layers import layer_table
from nest.costs.stage import Options, stage_cost, zero_schedule
from nest.problem.evaluate import make_problem
from nest.graph.layer_graph import Variant
from nest.problem.plan import place
from nest.spec.settings import TrainingSettings

MODES = ("none", "selective", "full")
ALL = Options((0, 1, 2, 3), MODES)


def problem(model="tiny_moe", n=8):
    pr = make_problem(model, "tiny_cluster", n, training=TrainingSettings(global_batch=16))
    return pr.with_variants([Variant(tp=2)])


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.sampled_from(["tiny_gpt", "tiny_moe", "tiny_llama"]), st.integers(1, 3),
       st.integers(1, 2), st.sampled_from(["replica_major", "stage_major"]),
       st.integers(0, 10_000))
def test_one_cell_equals_the_grid(model, p, d, placement, seed):
    pr = problem(model)
    rng = np.random.default_rng(seed)
    v = pr.graph.variants[rng.integers(len(pr.graph.variants))]
    if p * d * v.width > pr.num_devices:
        return
    lt = layer_table(pr, v, MODES)
    L = lt.num_layers
    ids = place(p, d, v.width, placement, tp=v.tp, cp=v.cp, ep=v.ep)
    j = int(rng.integers(p))
    kw = dict(next_ids=ids[j + 1] if j + 1 < p else None,
              prev_ids=ids[j - 1] if j > 0 else None,
              tied_partner=ids[p - 1 - j] if p > 1 and j in (0, p - 1) else None)
    grid = stage_cost(pr, lt, ids[j], d, ALL, 2, **kw)
    a = int(rng.integers(L))
    b = int(rng.integers(a, L))
    for z in ALL.zero_stages:
        for r in MODES:
            one = stage_cost(pr, lt, ids[j], d, Options((z,), (r,)), 2, cell=(a, b),
                             detail=True, **kw)
            zi, ri = ALL.zero_stages.index(z), MODES.index(r)
            assert one.t[0, 0] == pytest.approx(grid.t[b, a, zi, ri], rel=1e-12)
            assert one.u[0] == pytest.approx(grid.u[b, a, zi], rel=1e-12)
            assert one.mem[0, 0] == pytest.approx(grid.mem[b, a, zi, ri], rel=1e-12)
            x = one.detail  # the breakdown adds up to the totals
            assert sum(x["breakdown_s"].values()) == pytest.approx(one.t[0, 0], rel=1e-9)
            assert (sum(x["sync_breakdown_s"].values()) + x["optimizer_s"]
                    == pytest.approx(one.u[0], rel=1e-9))
            assert sum(x["memory_bytes"].values()) == pytest.approx(one.mem[0, 0], rel=1e-9)


def test_zero_schedule_closed_form():
    """Rajbhandari et al. 2020: what each ZeRO stage communicates, and when."""
    def coll(kind, which):
        return f"{kind}:{which}"

    table = {z: zero_schedule(z, coll) for z in range(4)}
    assert table[0] == ({}, {"all_reduce": "all_reduce:grad"})
    assert table[1] == ({}, {"reduce_scatter": "reduce_scatter:grad",
                             "all_gather": "all_gather:weight"})
    assert table[2] == ({"zero_reduce_scatter": "reduce_scatter:grad"},
                        {"all_gather": "all_gather:weight"})
    assert table[3] == ({"zero_reduce_scatter": "reduce_scatter:grad",
                         "zero3_all_gather.fwd": "all_gather:weight",
                         "zero3_all_gather.bwd": "all_gather:weight"}, {})


@pytest.mark.parametrize("z", [0, 1, 2, 3])
def test_memory_closed_form(z):
    """Weights 2 B, gradients 4 B, Adam states 12 B per parameter, sharded over the dense
    replicas (dp * ep * cp) or the expert replicas (dp * cp) from ZeRO stage 3 / 2 / 1 on."""
    pr = problem("tiny_moe")
    v, d = Variant(ep=2), 2
    lt = layer_table(pr, v, MODES)
    a, b = 1, 2  # two MoE blocks
    pd = lt.dense_L[a:b + 1].sum()
    pe = lt.expert_L[a:b + 1].sum()
    assert pe > 0
    nd, ne = shard_sizes(d, v.ep, v.cp)
    assert (nd, ne) == (4, 2)

    def held(bytes_per_param, from_stage):
        return bytes_per_param * ((pd / nd + pe / ne) if z >= from_stage else pd + pe)

    ids = place(1, d, v.width, "replica_major")[0]
    one = stage_cost(pr, lt, ids, d, Options((z,), ("none",)), 3, cell=(a, b), detail=True)
    mem = one.detail["memory_bytes"]
    assert mem["weights"] == pytest.approx(held(2, 3))
    assert mem["gradients"] == pytest.approx(held(4, 2))
    osb = pr.training.optimizer_state_bytes  # Adam: FP32 master copy + two moments
    assert osb == 12
    assert mem["optimizer_states"] == pytest.approx(held(osb, 1))
    assert mem["activations"] == pytest.approx(3 * lt.act_LR[a:b + 1, 0].sum())
    gathered = 2 * max(lt.dense_L[a:b + 1] + lt.expert_L[a:b + 1]) if z == 3 else 0.0
    assert mem["working"] == pytest.approx(gathered)  # no recomputation: no working set
    hw = pr.cluster.hardware
    alloc = held(2, 3) + held(4, 2) + held(osb, 1) + mem["activations"] + gathered
    assert one.mem[0, 0] == pytest.approx(peak(alloc, hw))
    assert one.mem[0, 0] == pytest.approx(alloc * (1 + hw.memory_fragmentation)
                                          + hw.memory_overhead_bytes)


def test_tied_embedding_kept_once_on_a_single_stage():
    """A tied model's head layer counts a copy of the word embedding; one stage holding both
    keeps one copy, and only two or more stages all-reduce it."""
    pr = make_problem("tiny_gpt", "tiny_cluster", 4, training=TrainingSettings(global_batch=8))
    assert pr.graph.tied_embeddings
    lt = layer_table(pr, Variant(), MODES)
    L = lt.num_layers
    V, h = pr.model.vocab_size, pr.model.hidden_size
    assert lt.pd_LL[L - 1, 0] == pytest.approx(lt.dense_L.sum() - V * h)
    assert lt.pd_LL[L - 1, 1] == pytest.approx(lt.dense_L[1:].sum())
